-- Every table keeps the record as a marshalled loops.v1 protobuf message in data; the other
-- columns are copies of fields needed for lookups, workspace scoping and ordering. Times are
-- unix nanoseconds; an unset optional time is NULL. Same tables, columns and indexes as the
-- SQLite store's migration of the same name; text columns compare bytewise (COLLATE "C"),
-- as SQLite's do, so both stores list in the same order whatever the cluster's locale.

CREATE TABLE sessions (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE INDEX sessions_by_workspace ON sessions (workspace, create_time DESC, id DESC);

CREATE TABLE training_runs (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    session_id  TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE INDEX training_runs_by_workspace ON training_runs (workspace, create_time DESC, id DESC);
CREATE INDEX training_runs_by_create_time ON training_runs (create_time DESC, id DESC);
CREATE INDEX training_runs_by_session ON training_runs (session_id);

CREATE TABLE checkpoints (
    training_run_id TEXT COLLATE "C" NOT NULL,
    id              TEXT COLLATE "C" NOT NULL,
    workspace       TEXT COLLATE "C" NOT NULL,
    create_time     BIGINT           NOT NULL,
    public          BOOLEAN          NOT NULL,
    expire_time     BIGINT,
    data            BYTEA            NOT NULL,
    PRIMARY KEY (training_run_id, id)
);
CREATE INDEX checkpoints_by_workspace ON checkpoints (workspace, create_time DESC, training_run_id DESC, id DESC);
CREATE INDEX checkpoints_by_run ON checkpoints (workspace, training_run_id, create_time DESC, id DESC);
CREATE INDEX checkpoints_by_expire_time ON checkpoints (expire_time) WHERE expire_time IS NOT NULL;

CREATE TABLE samplers (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    session_id  TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE INDEX samplers_by_workspace ON samplers (workspace, create_time DESC, id DESC);
CREATE INDEX samplers_by_session ON samplers (session_id);

CREATE TABLE operations (
    id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace       TEXT COLLATE "C" NOT NULL,
    training_run_id TEXT COLLATE "C" NOT NULL,
    create_time     BIGINT           NOT NULL,
    state           INTEGER          NOT NULL,
    done            BOOLEAN          NOT NULL,
    done_time       BIGINT,
    data            BYTEA            NOT NULL
);
CREATE INDEX operations_by_workspace ON operations (workspace, create_time DESC, id DESC);
CREATE INDEX operations_by_run ON operations (training_run_id);
CREATE INDEX operations_by_done ON operations (done, done_time);
