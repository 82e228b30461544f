-- Evals (loops.v1 Eval, in data, with its dataset as uploaded), named uniquely within a
-- workspace; their attachments to training runs (loops.v1 EvalAttachment); and their
-- results (loops.v1 EvalResult), one per (run, checkpoint, eval).

CREATE TABLE evals (
    id          TEXT NOT NULL PRIMARY KEY,
    workspace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB NOT NULL,
    dataset     BLOB NOT NULL
) STRICT;
CREATE UNIQUE INDEX evals_by_workspace_name ON evals (workspace, name);

CREATE TABLE eval_attachments (
    run_id      TEXT NOT NULL,
    eval_id     TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (run_id, eval_id)
) STRICT;
CREATE INDEX eval_attachments_by_eval ON eval_attachments (eval_id);

CREATE TABLE eval_results (
    run_id        TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    eval_id       TEXT NOT NULL,
    workspace     TEXT NOT NULL,
    create_time   INTEGER NOT NULL,
    data          BLOB NOT NULL,
    PRIMARY KEY (run_id, checkpoint_id, eval_id)
) STRICT;
CREATE INDEX eval_results_by_eval ON eval_results (workspace, eval_id, create_time DESC);
CREATE INDEX eval_results_by_run ON eval_results (workspace, run_id, create_time DESC);
