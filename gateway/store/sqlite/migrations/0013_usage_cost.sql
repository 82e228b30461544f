-- Usage rows gain their cost and API key (docs/operations.md, "Prices"): cost is the sum,
-- in pico-dollars (1e-12 USD), of what the priced part of amount cost under the price sheet
-- in force when each part was metered, and priced_amount is that part of amount (0: none of
-- it was priced, and the row shows no cost). key_id is the API key whose request did the
-- work ("key-" and 16 hex digits; '' for usage no request did, such as dedicated pool time)
-- and joins the key.

CREATE TABLE usage_v13 (
    workspace     TEXT    NOT NULL,
    bucket_start  INTEGER NOT NULL,
    base_model    TEXT    NOT NULL,
    session_id    TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    amount        INTEGER NOT NULL,
    deployment    TEXT    NOT NULL DEFAULT '',
    key_id        TEXT    NOT NULL DEFAULT '',
    priced_amount INTEGER NOT NULL DEFAULT 0,
    cost          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace, bucket_start, base_model, session_id, deployment, key_id, kind)
) STRICT;
INSERT INTO usage_v13 (workspace, bucket_start, base_model, session_id, kind, amount, deployment)
    SELECT workspace, bucket_start, base_model, session_id, kind, amount, deployment FROM usage;
DROP TABLE usage;
ALTER TABLE usage_v13 RENAME TO usage;
