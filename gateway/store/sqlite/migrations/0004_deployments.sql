-- Deployments (loops.v1 Deployment, in data), keyed by (workspace, name); the checkpoints
-- each pins (deployment_pins: DeleteCheckpoint and TTL expiry refuse them) and the
-- workspaces each is shared with (deployment_grants). Usage gains a deployment column:
-- tokens sampled through a deployment are counted under it ('' for other usage).

CREATE TABLE deployments (
    workspace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    data        BLOB    NOT NULL,
    PRIMARY KEY (workspace, name)
) STRICT;

CREATE TABLE deployment_pins (
    workspace       TEXT NOT NULL,
    training_run_id TEXT NOT NULL,
    checkpoint_id   TEXT NOT NULL,
    deployment      TEXT NOT NULL,
    PRIMARY KEY (workspace, training_run_id, checkpoint_id, deployment),
    FOREIGN KEY (workspace, deployment) REFERENCES deployments (workspace, name) ON DELETE CASCADE
) STRICT;
CREATE INDEX deployment_pins_by_deployment ON deployment_pins (workspace, deployment);

CREATE TABLE deployment_grants (
    grantee    TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    deployment TEXT NOT NULL,
    PRIMARY KEY (grantee, workspace, deployment),
    FOREIGN KEY (workspace, deployment) REFERENCES deployments (workspace, name) ON DELETE CASCADE
) STRICT;
CREATE INDEX deployment_grants_by_deployment ON deployment_grants (workspace, deployment);

CREATE TABLE usage_v4 (
    workspace    TEXT    NOT NULL,
    bucket_start INTEGER NOT NULL,
    base_model   TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    amount       INTEGER NOT NULL,
    deployment   TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (workspace, bucket_start, base_model, session_id, deployment, kind)
) STRICT;
INSERT INTO usage_v4 (workspace, bucket_start, base_model, session_id, kind, amount)
    SELECT workspace, bucket_start, base_model, session_id, kind, amount FROM usage;
DROP TABLE usage;
ALTER TABLE usage_v4 RENAME TO usage;
