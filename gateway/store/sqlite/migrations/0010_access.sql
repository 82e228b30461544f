-- Access requests (loops.v1 AccessRequest, in data) and the webhook deliveries of their
-- events. state is the AccessState number; one pending request per workspace, key and
-- model (the partial unique index); expire_time is a granted request's expiry in Unix
-- nanoseconds (0: none), which the expiry sweep selects on. A delivery keeps the signed
-- body it sends (body) and its loops.v1 WebhookDelivery (data); state is pending,
-- delivered or failed, next_attempt when a pending one is due.

CREATE TABLE access_requests (
    id           TEXT    NOT NULL PRIMARY KEY,
    workspace    TEXT    NOT NULL,
    requested_by TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    state        INTEGER NOT NULL,
    create_time  INTEGER NOT NULL,
    expire_time  INTEGER NOT NULL,
    data         BLOB    NOT NULL
) STRICT;
CREATE INDEX access_requests_by_workspace ON access_requests (workspace, create_time DESC, id DESC);
CREATE UNIQUE INDEX access_requests_one_pending ON access_requests (workspace, requested_by, model) WHERE state = 1;
CREATE INDEX access_requests_by_state ON access_requests (state, expire_time);

CREATE TABLE webhook_deliveries (
    id           TEXT    NOT NULL PRIMARY KEY,
    workspace    TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    create_time  INTEGER NOT NULL,
    next_attempt INTEGER NOT NULL,
    body         BLOB    NOT NULL,
    data         BLOB    NOT NULL
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt);
CREATE INDEX webhook_deliveries_by_workspace ON webhook_deliveries (workspace, create_time DESC, id DESC);
