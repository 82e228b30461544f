-- Per-step metrics of training runs (docs/semantics.md, "Run metrics"): one row per
-- forward_backward or optim_step, or per merged run of them after downsampling (seq_id is
-- the first one's, last_seq_id the last one's; step and last_step likewise; records of
-- different kinds interleave, those of one kind never overlap). data is the
-- loops.v1.StepMetrics record. ApplyBatch keeps at most store.MaxStepMetricsPerRun rows per
-- run.

CREATE TABLE step_metrics (
    run_id      TEXT COLLATE "C" NOT NULL,
    seq_id      BIGINT           NOT NULL,
    workspace   TEXT COLLATE "C" NOT NULL,
    kind        INTEGER          NOT NULL,
    last_seq_id BIGINT           NOT NULL,
    step        BIGINT           NOT NULL,
    last_step   BIGINT           NOT NULL,
    data        BYTEA            NOT NULL,
    PRIMARY KEY (run_id, seq_id)
);

-- A record's latest predecessor of the same kind (whether a merged record covers a seq_id).
CREATE INDEX step_metrics_kind ON step_metrics (run_id, kind, seq_id);
