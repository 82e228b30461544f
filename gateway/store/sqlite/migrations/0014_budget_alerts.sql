-- Budget alerts (docs/operations.md, "Budget alerts"): one row per alert threshold of a
-- budget crossed, a workspace's (key_id '') or one of its API keys', written in the same
-- transaction as its budget_alert audit event, so each threshold alerts exactly once per
-- period (period: the month "2026-12" of a monthly budget, '' for the total), also across a
-- crash between crossing it and recording it (a gateway that loads the spend records the
-- thresholds it passes that have no row). spent and limit_usd are pico-dollars; time is
-- unix nanoseconds of the crossing.

CREATE TABLE budget_alerts (
    workspace TEXT    NOT NULL,
    key_id    TEXT    NOT NULL,
    budget    TEXT    NOT NULL,
    period    TEXT    NOT NULL,
    percent   INTEGER NOT NULL,
    spent     INTEGER NOT NULL,
    limit_usd INTEGER NOT NULL,
    time      INTEGER NOT NULL,
    PRIMARY KEY (workspace, key_id, budget, period, percent)
) STRICT;
