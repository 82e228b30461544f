-- Placeholder: version 0006 belongs to another branch of issue 26 (the migration runner
-- needs versions without a gap). Delete this file when that branch's 0006 is merged.
SELECT 1;
