package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/receipt"
	"github.com/loops-dev/loops/internal/semantics"
)

// Receipts (docs/receipts.md). A run's record holds what its creation fixed (client, base
// model revision, LoRA config and seed, from_checkpoint, record_data); each state-changing
// step that succeeds (forward_backward, optim_step, save, load) becomes a ReceiptStep that
// the lane queues on the persister beside the step's metrics, so it goes out in the same
// journal write as the operation's outcome. At most Limits.MaxReceiptStepsPerRun steps are
// kept per run (counted in the run's record, so the count survives a restart); past it
// the record says receipt_truncated. A run that records data (record_data) keeps each
// forward_backward's batch in the checkpoint store (ckfiles.ReceiptBatchKey), written by
// the request that submits it, up to Limits.MaxRecordDataBytesPerRun bytes per run.

// MetaRecordData is the user_metadata key with which a tinker script asks for record_data
// (create_lora_training_client(user_metadata={"loops.record_data": "true"})).
const MetaRecordData = "loops.record_data"

// maxClientField bounds each field of a ClientInfo a run keeps.
const maxClientField = 256

// ReceiptService implements loops.v1 ReceiptService.
type ReceiptService struct{ c *Core }

// recordDataAsked reports whether a run's creation asks to record data.
func recordDataAsked(req *loopsv1.CreateTrainingRunRequest) (bool, error) {
	v := req.GetUserMetadata()[MetaRecordData]
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "false", "0", "no":
		return req.GetRecordData(), nil
	case "true", "1", "yes":
		return true, nil
	}
	return false, invalidArgument("user_metadata %s=%q must be true or false", MetaRecordData, v)
}

// clientInfo is a copy of c with each field cut to maxClientField bytes (nil for none).
func clientInfo(c *loopsv1.ClientInfo) *loopsv1.ClientInfo {
	if c == nil {
		return nil
	}
	cut := func(s string) string {
		for len(s) > maxClientField || !utf8.ValidString(s) {
			s = strings.ToValidUTF8(s[:min(len(s), maxClientField)], "")
		}
		return s
	}
	return &loopsv1.ClientInfo{Name: cut(c.GetName()), Version: cut(c.GetVersion()), Runtime: cut(c.GetRuntime()), UserAgent: cut(c.GetUserAgent())}
}

// recordBatch hashes a forward_backward's batch for the receipt and, when the run records
// data, keeps the batch in the checkpoint store. It runs in the submitting request, before
// the task is queued (its I/O is the request's own, under no lock).
func (c *Core) recordBatch(ctx context.Context, r *run, seq int64, req *loopsv1.ForwardBackwardRequest, t *task) {
	t.BatchHash = receipt.BatchHash(req.GetData())
	info := r.Record()
	if !info.GetRecordData() || info.GetRecordDataStopped() != "" {
		return
	}
	blob, err := receipt.EncodeBatch(&loopsv1.ReceiptBatch{
		TrainingRunId: r.ID(), SeqId: seq, Data: req.GetData(), LossFn: req.GetLossFn(), LossFnConfig: req.GetLossFnConfig(),
	})
	if err != nil {
		c.stopRecording(r, seq, "encoding the batch of seq_id "+fmt.Sprint(seq)+" failed: "+err.Error())
		return
	}
	limit := int64(c.opts.Limits.MaxRecordDataBytesPerRun)
	n := int64(len(blob))
	reserved := false
	c.updateRun(r, func(info *loopsv1.TrainingRun) {
		switch {
		case info.RecordDataStopped != "":
		case info.RecordedDataBytes+n > limit:
			info.RecordDataStopped = fmt.Sprintf("recording stopped at seq_id %d: its batch (%d bytes) would take the run past the "+
				"max_record_data_bytes limit of %d bytes per run (%d recorded); later batches are not recorded and the run can be "+
				"replayed only up to there. Record shorter runs, or ask the operator to raise loops serve --max-record-data-bytes",
				seq, n, limit, info.RecordedDataBytes)
		default:
			info.RecordedDataBytes += n
			reserved = true
		}
	})
	if !reserved {
		return
	}
	if err := c.putReceiptBatch(ctx, r, seq, blob); err != nil {
		c.log.Error("recording a batch failed", slog.String("run", r.ID()), slog.Int64("seq_id", seq), slog.Any("err", err))
		c.stopRecording(r, seq, fmt.Sprintf("recording stopped at seq_id %d: the checkpoint store refused its batch (incident logged)", seq))
		return
	}
	t.DataRecorded = true
}

// stopRecording ends a run's recording with reason (the first reason stays).
func (c *Core) stopRecording(r *run, seq int64, reason string) {
	c.log.Warn("a run stopped recording its batches", slog.String("run", r.ID()), slog.Int64("seq_id", seq), slog.String("reason", reason))
	c.updateRun(r, func(info *loopsv1.TrainingRun) {
		if info.RecordDataStopped == "" {
			info.RecordDataStopped = reason
		}
	})
}

// putReceiptBatch writes a recorded batch into the checkpoint store, through a folder in
// the staging area (the store puts folders).
func (c *Core) putReceiptBatch(ctx context.Context, r *run, seq int64, blob []byte) error {
	key, err := ckfiles.ReceiptBatchKey(r.Workspace(), r.ID(), seq)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(c.ckpt.Staging(), "receipt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, ckfiles.ReceiptBatchFile), blob, 0o600); err != nil {
		return err
	}
	_, err = c.ckpt.Store().Put(ctx, key, dir)
	return err
}

// recordReceipt completes a receipt step of run r (run, step and time) and queues it for
// the store while the run holds fewer than Limits.MaxReceiptStepsPerRun; past it the run's
// record says receipt_truncated. Called by the lane before the operation's outcome.
func (c *Core) recordReceipt(r *run, s *loopsv1.ReceiptStep) {
	limit := int64(c.opts.Limits.MaxReceiptStepsPerRun)
	keep := false
	c.updateRun(r, func(info *loopsv1.TrainingRun) {
		if info.ReceiptSteps < limit {
			info.ReceiptSteps++
			keep = true
		} else {
			info.ReceiptTruncated = true
		}
	})
	if !keep {
		return
	}
	s.TrainingRunId = r.ID()
	s.Step = r.Record().GetOptimSteps() + 1
	s.Time = timestamppb.New(c.now())
	c.ops.persist.ReceiptStep(r.Workspace(), s)
}

// fbReceipt is a forward_backward's receipt step.
func fbReceipt(t *task, res *loopsv1.ForwardBackwardResult) *loopsv1.ReceiptStep {
	s := &loopsv1.ReceiptStep{
		SeqId: t.Seq, Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
		LossFn: t.FB.GetLossFn(), LossFnConfig: t.FB.GetLossFnConfig(),
		BatchSha256: t.BatchHash, Examples: int32(len(t.FB.GetData())), Tokens: int64(t.Tokens), DataRecorded: t.DataRecorded,
	}
	if l, ok := res.GetMetrics()["loss:sum"]; ok {
		s.Loss = proto.Float64(l)
	}
	return s
}

// taskReceipt is the receipt step of an optim_step, save or load that succeeded with the
// result set gave (nil: none).
func taskReceipt(t *task, set func(*loopsv1.Operation)) *loopsv1.ReceiptStep {
	kind := t.Op.op.GetKind()
	s := &loopsv1.ReceiptStep{SeqId: t.Seq, Kind: kind}
	res := &loopsv1.Operation{}
	if set != nil {
		set(res)
	}
	switch kind {
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
		s.Adam = semantics.AdamWithDefaults(t.Adam)
	case loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS, loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER:
		s.CheckpointPath = res.GetSaveWeights().GetPath()
	case loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		s.CheckpointPath = res.GetLoadWeights().GetPath()
	default:
		return nil
	}
	return s
}

// GetRunReceipt returns a page of a run's receipt.
func (s ReceiptService) GetRunReceipt(ctx context.Context, req *loopsv1.GetRunReceiptRequest) (*loopsv1.RunReceipt, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case req.GetFromSeqId() < 0:
		return nil, invalidArgument("from_seq_id must be >= 0, got %d", req.GetFromSeqId())
	case req.GetPageSize() < 0 || req.GetPageSize() > receiptPageMax:
		return nil, invalidArgument("page_size must be 0 to %d (0: %d), got %d", receiptPageMax, receiptPageMax, req.GetPageSize())
	}
	r, err := c.runOf(ws, req.GetTrainingRunId())
	if err != nil {
		return nil, err
	}
	info := r.Record()
	limit := int(req.GetPageSize())
	if limit == 0 {
		limit = receiptPageMax
	}
	// One more than the page: whether a next page exists.
	steps, _, err := c.store.ListReceiptSteps(ctx, ws, r.ID(), req.GetFromSeqId(), limit+1)
	if err != nil {
		return nil, internal("reading a receipt", err)
	}
	out := &loopsv1.RunReceipt{
		TrainingRunId: r.ID(), BaseModel: info.GetBaseModel(), BaseModelRevision: info.GetBaseModelRevision(),
		Lora: info.GetLora(), Client: info.GetClient(), FromCheckpoint: info.GetFromCheckpoint(), CreateTime: info.GetCreateTime(),
		BatchEncoding: receipt.BatchEncoding, RecordData: info.GetRecordData(), RecordedDataBytes: info.GetRecordedDataBytes(),
		MaxRecordDataBytes: int64(c.opts.Limits.MaxRecordDataBytesPerRun), RecordDataStopped: info.GetRecordDataStopped(),
		MaxSteps: int32(c.opts.Limits.MaxReceiptStepsPerRun), Truncated: info.GetReceiptTruncated(),
	}
	if len(steps) > limit {
		out.NextSeqId = steps[limit].GetSeqId()
		steps = steps[:limit]
	}
	out.Steps = steps
	return out, nil
}

// receiptPageMax is the most steps a GetRunReceipt page holds.
const receiptPageMax = 1000

// GetReceiptBatch returns a batch a run recording data kept.
func (s ReceiptService) GetReceiptBatch(ctx context.Context, req *loopsv1.GetReceiptBatchRequest) (*loopsv1.ReceiptBatch, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetSeqId() <= 0 {
		return nil, invalidArgument("seq_id must be positive, got %d", req.GetSeqId())
	}
	r, err := c.runOf(ws, req.GetTrainingRunId())
	if err != nil {
		return nil, err
	}
	key, err := ckfiles.ReceiptBatchKey(ws, r.ID(), req.GetSeqId())
	if err != nil {
		return nil, err
	}
	rc, _, err := c.ckpt.Store().Open(ctx, key, ckfiles.ReceiptBatchFile)
	if errors.Is(err, ckstore.ErrNotFound) {
		return nil, notFound("training run %s has no recorded batch for seq_id %d (only forward_backward steps of a run created with record_data are kept; see its receipt)", r.ID(), req.GetSeqId())
	}
	if err != nil {
		return nil, internal("opening a recorded batch", err)
	}
	defer rc.Close()
	blob, err := io.ReadAll(io.LimitReader(rc, receipt.MaxBatchBytes+1))
	if errors.Is(err, ckstore.ErrCorrupt) {
		return nil, connect.NewError(connect.CodeDataLoss, fmt.Errorf("the recorded batch of training run %s at seq_id %d does not match what was stored (the checkpoint store's copy changed): it cannot be replayed", r.ID(), req.GetSeqId()))
	}
	if err != nil {
		return nil, internal("reading a recorded batch", err)
	}
	b, err := receipt.DecodeBatch(blob)
	if err != nil {
		return nil, connect.NewError(connect.CodeDataLoss, fmt.Errorf("the recorded batch of training run %s at seq_id %d is unreadable: %w", r.ID(), req.GetSeqId(), err))
	}
	if b.GetTrainingRunId() != r.ID() || b.GetSeqId() != req.GetSeqId() {
		return nil, connect.NewError(connect.CodeDataLoss, fmt.Errorf("the recorded batch stored for training run %s at seq_id %d names run %s seq_id %d", r.ID(), req.GetSeqId(), b.GetTrainingRunId(), b.GetSeqId()))
	}
	return b, nil
}
