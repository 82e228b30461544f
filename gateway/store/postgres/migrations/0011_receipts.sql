-- Receipt steps of training runs (docs/receipts.md): one row per forward_backward,
-- optim_step, checkpoint save or weights load that succeeded, keyed by the run and the
-- operation's seq_id. data is the loops.v1.ReceiptStep record. ApplyBatch keeps at most the
-- run's cap (Limits.MaxReceiptStepsPerRun) rows per run: the first steps.

CREATE TABLE receipt_steps (
    run_id    TEXT COLLATE "C" NOT NULL,
    seq_id    BIGINT           NOT NULL,
    workspace TEXT COLLATE "C" NOT NULL,
    data      BYTEA            NOT NULL,
    PRIMARY KEY (run_id, seq_id)
);
