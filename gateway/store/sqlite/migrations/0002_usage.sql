-- Usage counters, one row per (workspace, hour bucket, base model, session, kind); AddUsage
-- adds to amount. bucket_start is unix nanoseconds of the bucket's start (UTC hour).

CREATE TABLE usage (
    workspace    TEXT    NOT NULL,
    bucket_start INTEGER NOT NULL,
    base_model   TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    amount       INTEGER NOT NULL,
    PRIMARY KEY (workspace, bucket_start, base_model, session_id, kind)
) STRICT;
