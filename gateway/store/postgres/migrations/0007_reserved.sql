-- Reserved: another change of issue 26 adds migration 0007. This no-op keeps the versions
-- gapless on this branch; the merge replaces it with that migration.
SELECT 1;
