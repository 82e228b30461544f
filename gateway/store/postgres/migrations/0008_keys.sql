-- API keys as records (loops.v1 ApiKey, in data, without its times of last use and
-- revocation, which are columns: 0 is never) and the Ed25519 keys that sign access tokens.
-- hash is the hex SHA-256 of the key's secret; the secret is never stored. Same tables,
-- columns and indexes as the SQLite store's migration of the same name.

CREATE TABLE api_keys (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace   TEXT COLLATE "C" NOT NULL,
    hash        TEXT COLLATE "C" NOT NULL,
    create_time BIGINT           NOT NULL,
    last_used   BIGINT           NOT NULL,
    revoke_time BIGINT           NOT NULL,
    data        BYTEA            NOT NULL
);
CREATE UNIQUE INDEX api_keys_by_hash ON api_keys (hash);
CREATE INDEX api_keys_by_workspace ON api_keys (workspace, create_time DESC, id DESC);
CREATE INDEX api_keys_by_time ON api_keys (create_time DESC, id DESC);

CREATE TABLE signing_keys (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    create_time BIGINT           NOT NULL,
    seed        BYTEA            NOT NULL
);
