-- Usage rows gain the training run whose usage they count (docs/operations.md, "Prices"):
-- checkpoint storage (checkpoint_byte_seconds) and dedicated pool time are metered per run,
-- so a run's storage cost is known, not only its session's. training_run_id is '' for
-- usage of no one run (tokens, which are kept per session) and for rows metered before this
-- migration, which keep their session and still list, sum and price as before. Same as the
-- SQLite migration.

ALTER TABLE usage ADD COLUMN training_run_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE usage DROP CONSTRAINT usage_pkey;
ALTER TABLE usage ADD PRIMARY KEY (workspace, bucket_start, base_model, session_id, training_run_id, deployment, key_id, kind);
