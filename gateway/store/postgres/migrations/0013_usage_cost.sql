-- Usage rows gain their cost and API key (docs/operations.md, "Prices"): cost is the sum,
-- in pico-dollars (1e-12 USD), of what the priced part of amount cost under the price sheet
-- in force when each part was metered, and priced_amount is that part of amount (0: none of
-- it was priced, and the row shows no cost). key_id is the API key whose request did the
-- work ("key-" and 16 hex digits; '' for usage no request did, such as dedicated pool time)
-- and joins the key. Same as the SQLite migration.

ALTER TABLE usage ADD COLUMN key_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN priced_amount BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN cost BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage DROP CONSTRAINT usage_pkey;
ALTER TABLE usage ADD PRIMARY KEY (workspace, bucket_start, base_model, session_id, deployment, key_id, kind);
