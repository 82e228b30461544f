-- The audit log: one row per mutating call of a workspace, append-only (only the retention
-- sweep and the per-workspace cap delete rows, oldest first). seq orders the log; time is
-- unix nanoseconds of the call's arrival. Checkpoints get their size as a column, so that a
-- workspace's checkpoint storage is one aggregate query (NULL: written before this
-- migration; its size is read from data). Same tables, columns and indexes as the SQLite
-- store's migration of the same name.

CREATE TABLE audit_events (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    time        BIGINT           NOT NULL,
    key_id      TEXT COLLATE "C" NOT NULL,
    client_addr TEXT COLLATE "C" NOT NULL,
    surface     TEXT COLLATE "C" NOT NULL,
    action      TEXT COLLATE "C" NOT NULL,
    event       TEXT COLLATE "C" NOT NULL,
    resource    TEXT COLLATE "C" NOT NULL,
    target      TEXT COLLATE "C" NOT NULL,
    status      INTEGER          NOT NULL,
    code        TEXT COLLATE "C" NOT NULL
);
CREATE INDEX audit_events_by_workspace ON audit_events (workspace, seq);
CREATE INDEX audit_events_by_time ON audit_events (time);

ALTER TABLE checkpoints ADD COLUMN size_bytes BIGINT;
