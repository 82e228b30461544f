-- Projects (loops.v1 Project, in data), named uniquely within a workspace, and what a
-- session search filters on: copies of a session's project ('' for sessions stored before
-- this migration or without a project: the "default" project), status ('' while active,
-- else its end reason), owner (the creating key's id) and display name, and its labels
-- (user_metadata pairs, kind 'm', and tags, kind 't', each within the store's size bounds).

ALTER TABLE sessions ADD COLUMN project TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN status TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN display_name TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_by_project ON sessions (workspace, project, create_time DESC, id DESC);

CREATE TABLE session_labels (
    session_id TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (session_id, kind, name)
) STRICT;
CREATE INDEX session_labels_by_value ON session_labels (workspace, kind, name, value);

CREATE TABLE projects (
    workspace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB    NOT NULL,
    PRIMARY KEY (workspace, name)
) STRICT;
