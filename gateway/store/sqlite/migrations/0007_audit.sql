-- The audit log: one row per mutating call of a workspace, append-only (only the retention
-- sweep and the per-workspace cap delete rows, oldest first). seq orders the log; time is
-- unix nanoseconds of the call's arrival. Checkpoints get their size as a column, so that a
-- workspace's checkpoint storage is one aggregate query (NULL: written before this
-- migration; its size is read from data). Same tables, columns and indexes as the
-- PostgreSQL store's migration of the same name.

CREATE TABLE audit_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace   TEXT    NOT NULL,
    time        INTEGER NOT NULL,
    key_id      TEXT    NOT NULL,
    client_addr TEXT    NOT NULL,
    surface     TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    resource    TEXT    NOT NULL,
    target      TEXT    NOT NULL,
    status      INTEGER NOT NULL,
    code        TEXT    NOT NULL
) STRICT;
CREATE INDEX audit_events_by_workspace ON audit_events (workspace, seq);
CREATE INDEX audit_events_by_time ON audit_events (time);

ALTER TABLE checkpoints ADD COLUMN size_bytes INTEGER;
