-- Placeholder so that this branch's migration 0008 (keys) applies: another branch of issue 26
-- owns migration 0007. Drop this file when merging that branch's.
SELECT 1;
