-- Managed jobs (loops.v1 Job, in data), owned by a workspace; state is the Job's state
-- number, so a starting gateway finds the jobs its previous process left running. Logs are
-- files under the data dir (jobs/<id>/log), not rows. Same tables, columns and indexes as
-- the SQLite store's migration of the same name.

CREATE TABLE jobs (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    state       INTEGER          NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE INDEX jobs_by_workspace ON jobs (workspace, create_time DESC, id DESC);
CREATE INDEX jobs_by_state ON jobs (state);
