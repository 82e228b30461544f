-- Weights-access tokens (loops.v1 WeightsAccessToken, in data), owned by the workspace that
-- issued them. Only the SHA-256 of a token's secret is kept (token_hash, hex), which is how
-- a copy_weights finds it; expire_time bounds its life (the janitor deletes expired ones).
-- Same tables, columns and indexes as the SQLite store's migration of the same name.

CREATE TABLE weights_access_tokens (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    token_hash  TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    expire_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE INDEX weights_access_tokens_by_workspace ON weights_access_tokens (workspace, create_time DESC, id DESC);
CREATE UNIQUE INDEX weights_access_tokens_by_hash ON weights_access_tokens (token_hash);
CREATE INDEX weights_access_tokens_by_expiry ON weights_access_tokens (expire_time);
