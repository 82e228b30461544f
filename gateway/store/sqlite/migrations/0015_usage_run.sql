-- Usage rows gain the training run whose usage they count (docs/operations.md, "Prices"):
-- checkpoint storage (checkpoint_byte_seconds) and dedicated pool time are metered per run,
-- so a run's storage cost is known, not only its session's. training_run_id is '' for
-- usage of no one run (tokens, which are kept per session) and for rows metered before this
-- migration, which keep their session and still list, sum and price as before.

CREATE TABLE usage_v15 (
    workspace       TEXT    NOT NULL,
    bucket_start    INTEGER NOT NULL,
    base_model      TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    amount          INTEGER NOT NULL,
    deployment      TEXT    NOT NULL DEFAULT '',
    key_id          TEXT    NOT NULL DEFAULT '',
    priced_amount   INTEGER NOT NULL DEFAULT 0,
    cost            INTEGER NOT NULL DEFAULT 0,
    training_run_id TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (workspace, bucket_start, base_model, session_id, training_run_id, deployment, key_id, kind)
) STRICT;
INSERT INTO usage_v15 (workspace, bucket_start, base_model, session_id, kind, amount, deployment, key_id, priced_amount, cost)
    SELECT workspace, bucket_start, base_model, session_id, kind, amount, deployment, key_id, priced_amount, cost FROM usage;
DROP TABLE usage;
ALTER TABLE usage_v15 RENAME TO usage;
