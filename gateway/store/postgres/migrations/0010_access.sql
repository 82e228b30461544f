-- Same tables, columns and indexes as the SQLite store's migration of the same name.
-- Access requests (loops.v1 AccessRequest, in data) and the webhook deliveries of their
-- events. state is the AccessState number; one pending request per workspace, key and
-- model (the partial unique index); expire_time is a granted request's expiry in Unix
-- nanoseconds (0: none), which the expiry sweep selects on. A delivery keeps the signed
-- body it sends (body) and its loops.v1 WebhookDelivery (data); state is pending,
-- delivered or failed, next_attempt when a pending one is due.

CREATE TABLE access_requests (
    id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace    TEXT COLLATE "C" NOT NULL,
    requested_by TEXT COLLATE "C" NOT NULL,
    model        TEXT COLLATE "C" NOT NULL,
    state        BIGINT NOT NULL,
    create_time  BIGINT NOT NULL,
    expire_time  BIGINT NOT NULL,
    data         BYTEA NOT NULL
);
CREATE INDEX access_requests_by_workspace ON access_requests (workspace, create_time DESC, id DESC);
CREATE UNIQUE INDEX access_requests_one_pending ON access_requests (workspace, requested_by, model) WHERE state = 1;
CREATE INDEX access_requests_by_state ON access_requests (state, expire_time);

CREATE TABLE webhook_deliveries (
    id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    workspace    TEXT COLLATE "C" NOT NULL,
    state        TEXT COLLATE "C" NOT NULL,
    create_time  BIGINT NOT NULL,
    next_attempt BIGINT NOT NULL,
    body         BYTEA NOT NULL,
    data         BYTEA NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt);
CREATE INDEX webhook_deliveries_by_workspace ON webhook_deliveries (workspace, create_time DESC, id DESC);
