-- Every table keeps the record as a marshalled loops.v1 protobuf message in data; the other
-- columns are copies of fields needed for lookups, workspace scoping and ordering. Times are
-- unix nanoseconds; an unset optional time is NULL.

CREATE TABLE sessions (
    id          TEXT    NOT NULL PRIMARY KEY,
    workspace   TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB    NOT NULL
) STRICT;
CREATE INDEX sessions_by_workspace ON sessions (workspace, create_time DESC, id DESC);

CREATE TABLE training_runs (
    id          TEXT    NOT NULL PRIMARY KEY,
    workspace   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB    NOT NULL
) STRICT;
CREATE INDEX training_runs_by_workspace ON training_runs (workspace, create_time DESC, id DESC);
CREATE INDEX training_runs_by_create_time ON training_runs (create_time DESC, id DESC);
CREATE INDEX training_runs_by_session ON training_runs (session_id);

CREATE TABLE checkpoints (
    training_run_id TEXT    NOT NULL,
    id              TEXT    NOT NULL,
    workspace       TEXT    NOT NULL,
    create_time     INTEGER NOT NULL,
    public          INTEGER NOT NULL,
    expire_time     INTEGER,
    data            BLOB    NOT NULL,
    PRIMARY KEY (training_run_id, id)
) STRICT;
CREATE INDEX checkpoints_by_workspace ON checkpoints (workspace, create_time DESC, training_run_id DESC, id DESC);
CREATE INDEX checkpoints_by_run ON checkpoints (workspace, training_run_id, create_time DESC, id DESC);
CREATE INDEX checkpoints_by_expire_time ON checkpoints (expire_time) WHERE expire_time IS NOT NULL;

CREATE TABLE samplers (
    id          TEXT    NOT NULL PRIMARY KEY,
    workspace   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB    NOT NULL
) STRICT;
CREATE INDEX samplers_by_workspace ON samplers (workspace, create_time DESC, id DESC);
CREATE INDEX samplers_by_session ON samplers (session_id);

CREATE TABLE operations (
    id              TEXT    NOT NULL PRIMARY KEY,
    workspace       TEXT    NOT NULL,
    training_run_id TEXT    NOT NULL,
    create_time     INTEGER NOT NULL,
    state           INTEGER NOT NULL,
    done            INTEGER NOT NULL,
    done_time       INTEGER,
    data            BLOB    NOT NULL
) STRICT;
CREATE INDEX operations_by_workspace ON operations (workspace, create_time DESC, id DESC);
CREATE INDEX operations_by_run ON operations (training_run_id);
CREATE INDEX operations_by_done ON operations (done, done_time);
