-- Evals (loops.v1 Eval, in data, with its dataset as uploaded), named uniquely within a
-- workspace; their attachments to training runs (loops.v1 EvalAttachment); and their
-- results (loops.v1 EvalResult), one per (run, checkpoint, eval).
-- Same tables, columns and indexes as the SQLite store's migration of the same name.

CREATE TABLE evals (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    create_time BIGINT NOT NULL,
    data        BYTEA NOT NULL,
    dataset     BYTEA NOT NULL
);
CREATE UNIQUE INDEX evals_by_workspace_name ON evals (workspace, name);

CREATE TABLE eval_attachments (
    run_id      TEXT COLLATE "C" NOT NULL,
    eval_id     TEXT COLLATE "C" NOT NULL,
    workspace   TEXT COLLATE "C" NOT NULL,
    create_time BIGINT NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (run_id, eval_id)
);
CREATE INDEX eval_attachments_by_eval ON eval_attachments (eval_id);

CREATE TABLE eval_results (
    run_id        TEXT COLLATE "C" NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    eval_id       TEXT COLLATE "C" NOT NULL,
    workspace     TEXT COLLATE "C" NOT NULL,
    create_time   BIGINT NOT NULL,
    data          BYTEA NOT NULL,
    PRIMARY KEY (run_id, checkpoint_id, eval_id)
);
CREATE INDEX eval_results_by_eval ON eval_results (workspace, eval_id, create_time DESC);
CREATE INDEX eval_results_by_run ON eval_results (workspace, run_id, create_time DESC);
