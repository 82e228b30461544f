-- Deployments (loops.v1 Deployment, in data), keyed by (workspace, name); the checkpoints
-- each pins (deployment_pins: DeleteCheckpoint and TTL expiry refuse them) and the
-- workspaces each is shared with (deployment_grants). Usage gains a deployment column:
-- tokens sampled through a deployment are counted under it ('' for other usage). Same
-- tables, columns and indexes as the SQLite store's migration of the same name.

CREATE TABLE deployments (
    workspace   TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL,
    PRIMARY KEY (workspace, name)
);

CREATE TABLE deployment_pins (
    workspace       TEXT COLLATE "C" NOT NULL,
    training_run_id TEXT COLLATE "C" NOT NULL,
    checkpoint_id   TEXT COLLATE "C" NOT NULL,
    deployment      TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (workspace, training_run_id, checkpoint_id, deployment),
    FOREIGN KEY (workspace, deployment) REFERENCES deployments (workspace, name) ON DELETE CASCADE
);
CREATE INDEX deployment_pins_by_deployment ON deployment_pins (workspace, deployment);

CREATE TABLE deployment_grants (
    grantee    TEXT COLLATE "C" NOT NULL,
    workspace  TEXT COLLATE "C" NOT NULL,
    deployment TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (grantee, workspace, deployment),
    FOREIGN KEY (workspace, deployment) REFERENCES deployments (workspace, name) ON DELETE CASCADE
);
CREATE INDEX deployment_grants_by_deployment ON deployment_grants (workspace, deployment);

ALTER TABLE usage ADD COLUMN deployment TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE usage DROP CONSTRAINT usage_pkey;
ALTER TABLE usage ADD PRIMARY KEY (workspace, bucket_start, base_model, session_id, deployment, kind);
