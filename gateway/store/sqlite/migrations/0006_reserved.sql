-- Reserved: another change of issue 26 adds migration 0006. This no-op keeps the versions
-- gapless on this branch; the merge replaces it with that migration.
SELECT 1;
