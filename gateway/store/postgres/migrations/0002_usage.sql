-- Usage counters, one row per (workspace, hour bucket, base model, session, kind); AddUsage
-- adds to amount. bucket_start is unix nanoseconds of the bucket's start (UTC hour).

CREATE TABLE usage (
    workspace    TEXT COLLATE "C" NOT NULL,
    bucket_start BIGINT           NOT NULL,
    base_model   TEXT COLLATE "C" NOT NULL,
    session_id   TEXT COLLATE "C" NOT NULL,
    kind         TEXT COLLATE "C" NOT NULL,
    amount       BIGINT           NOT NULL,
    PRIMARY KEY (workspace, bucket_start, base_model, session_id, kind)
);
