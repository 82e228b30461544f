-- Managed jobs (loops.v1 Job, in data), owned by a workspace; state is the Job's state
-- number, so a starting gateway finds the jobs its previous process left running. Logs are
-- files under the data dir (jobs/<id>/log), not rows.

CREATE TABLE jobs (
    id          TEXT    NOT NULL PRIMARY KEY,
    workspace   TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    data        BLOB    NOT NULL
) STRICT;
CREATE INDEX jobs_by_workspace ON jobs (workspace, create_time DESC, id DESC);
CREATE INDEX jobs_by_state ON jobs (state);
