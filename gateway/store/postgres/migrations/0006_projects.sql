-- Projects (loops.v1 Project, in data), named uniquely within a workspace, and what a
-- session search filters on: copies of a session's project ('' for sessions stored before
-- this migration or without a project: the "default" project), status ('' while active,
-- else its end reason), owner (the creating key's id) and display name, and its labels
-- (user_metadata pairs, kind 'm', and tags, kind 't', each within the store's size bounds).
-- Same tables, columns and indexes as the SQLite store's migration of the same name.

ALTER TABLE sessions ADD COLUMN project TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN status TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN owner TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN display_name TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX sessions_by_project ON sessions (workspace, project, create_time DESC, id DESC);

CREATE TABLE session_labels (
    session_id TEXT COLLATE "C" NOT NULL,
    workspace  TEXT COLLATE "C" NOT NULL,
    kind       TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    value      TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (session_id, kind, name)
);
CREATE INDEX session_labels_by_value ON session_labels (workspace, kind, name, value);

CREATE TABLE projects (
    workspace   TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL,
    PRIMARY KEY (workspace, name)
);
