-- Usage rows gain their cost (docs/operations.md, "Prices"): cost is the sum, in
-- pico-dollars (1e-12 USD), of what the priced part of amount cost under the price sheet in
-- force when each part was metered, and priced_amount is that part of amount (0: none of
-- it was priced, and the row shows no cost).

ALTER TABLE usage ADD COLUMN cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN priced_amount INTEGER NOT NULL DEFAULT 0;
