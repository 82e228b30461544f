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
    -- kind before seq_id: a record's latest predecessor of the same kind (does a merged
    -- record cover a seq_id?) is one seek; lists sort a run's rows (at most a few thousand).
    PRIMARY KEY (run_id, kind, seq_id)
);
