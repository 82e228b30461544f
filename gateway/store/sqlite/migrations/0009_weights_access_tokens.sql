-- Weights-access tokens (loops.v1 WeightsAccessToken, in data), owned by the workspace that
-- issued them. Only the SHA-256 of a token's secret is kept (token_hash, hex), which is how
-- a copy_weights finds it; expire_time bounds its life (the janitor deletes expired ones).

CREATE TABLE weights_access_tokens (
    id          TEXT    NOT NULL PRIMARY KEY,
    workspace   TEXT    NOT NULL,
    token_hash  TEXT    NOT NULL,
    create_time INTEGER NOT NULL,
    expire_time INTEGER NOT NULL,
    data        BLOB    NOT NULL
) STRICT;
CREATE INDEX weights_access_tokens_by_workspace ON weights_access_tokens (workspace, create_time DESC, id DESC);
CREATE UNIQUE INDEX weights_access_tokens_by_hash ON weights_access_tokens (token_hash);
CREATE INDEX weights_access_tokens_by_expiry ON weights_access_tokens (expire_time);
