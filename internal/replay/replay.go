package replay

import (
	"context"
	"errors"
	"fmt"
	"math"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// MetaReplayOf is the user_metadata key that names, on a replay's run, the run it replays.
const MetaReplayOf = "loops.replay_of"

// Clients are the loops.v1 services a replay calls.
type Clients struct {
	Training   loopsv1connect.TrainingServiceClient
	Operations loopsv1connect.OperationServiceClient
	Receipts   loopsv1connect.ReceiptServiceClient
}

// Report is a replay's outcome.
type Report struct {
	TrainingRunID string `json:"training_run_id"`
	ReplayRunID   string `json:"replay_run_id"`
	// Steps is how many steps the receipt lists; Replayed how many ran (forward_backward
	// and optim_step; saves are skipped: they change nothing).
	Steps    int `json:"steps"`
	Replayed int `json:"replayed"`
	// ForwardBackwards is how many losses were compared.
	ForwardBackwards int  `json:"forward_backwards"`
	Matched          bool `json:"matched"`
	// BaseModelRevision is the recorded one; ReplayBaseModelRevision the replay's (they
	// differ when the base model's files changed).
	BaseModelRevision       string    `json:"base_model_revision"`
	ReplayBaseModelRevision string    `json:"replay_base_model_revision"`
	FirstMismatch           *Mismatch `json:"first_mismatch,omitempty"`
}

// Mismatch is the first step whose replay differs.
type Mismatch struct {
	SeqID int64  `json:"seq_id"`
	Step  int64  `json:"step"`
	Kind  string `json:"kind"`
	// The recorded and replayed loss ("loss:sum"), and their float64 bits in hex.
	RecordedLoss     *float64 `json:"recorded_loss,omitempty"`
	ReplayedLoss     *float64 `json:"replayed_loss,omitempty"`
	RecordedLossBits string   `json:"recorded_loss_bits,omitempty"`
	ReplayedLossBits string   `json:"replayed_loss_bits,omitempty"`
	// The batch's hash in the receipt and that of the batch stored now.
	RecordedBatchSHA256 string `json:"recorded_batch_sha256,omitempty"`
	StoredBatchSHA256   string `json:"stored_batch_sha256,omitempty"`
	Reason              string `json:"reason"`
}

// Receipt reads a run's whole receipt (every page).
func Receipt(ctx context.Context, rc loopsv1connect.ReceiptServiceClient, runID string) (*loopsv1.RunReceipt, error) {
	var out *loopsv1.RunReceipt
	from := int64(0)
	for {
		page, err := rc.GetRunReceipt(ctx, &loopsv1.GetRunReceiptRequest{TrainingRunId: runID, FromSeqId: from})
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = page
		} else {
			out.Steps = append(out.Steps, page.GetSteps()...)
		}
		if page.GetNextSeqId() <= from || page.GetNextSeqId() == 0 {
			out.NextSeqId = 0
			return out, nil
		}
		from = page.GetNextSeqId()
	}
}

// Replayable says why a receipt cannot be replayed (nil when it can).
func Replayable(r *loopsv1.RunReceipt) error {
	id := r.GetTrainingRunId()
	switch {
	case !r.GetRecordData():
		return fmt.Errorf("training run %s did not record its data: create the run with record_data (user_metadata {\"loops.record_data\": \"true\"} from a tinker script, or loops.v1 record_data) to replay it", id)
	case r.GetRecordDataStopped() != "":
		return fmt.Errorf("training run %s cannot be replayed: %s", id, r.GetRecordDataStopped())
	case r.GetTruncated():
		return fmt.Errorf("training run %s took more steps than its receipt lists (max_steps %d): it cannot be replayed", id, r.GetMaxSteps())
	case r.GetFromCheckpoint() != "":
		return fmt.Errorf("training run %s started from checkpoint %s: a replay starts from a fresh adapter, so it cannot replay it", id, r.GetFromCheckpoint())
	}
	for _, s := range r.GetSteps() {
		switch {
		case s.GetKind() == loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
			return fmt.Errorf("training run %s loaded weights (%s) at seq_id %d: a replay cannot reproduce a load", id, s.GetCheckpointPath(), s.GetSeqId())
		case s.GetKind() == loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD && !s.GetDataRecorded():
			return fmt.Errorf("training run %s has no recorded batch for its forward_backward at seq_id %d", id, s.GetSeqId())
		}
	}
	return nil
}

// Run replays the run runID and reports the first step whose loss differs. progress, when
// not nil, is called after each replayed step.
func Run(ctx context.Context, cl Clients, runID string, progress func(done, total int)) (*Report, error) {
	rec, err := Receipt(ctx, cl.Receipts, runID)
	if err != nil {
		return nil, err
	}
	if err := Replayable(rec); err != nil {
		return nil, err
	}
	rep := &Report{TrainingRunID: rec.GetTrainingRunId(), Steps: len(rec.GetSteps()), BaseModelRevision: rec.GetBaseModelRevision()}
	op, err := cl.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: rec.GetBaseModel(), Lora: rec.GetLora(),
		UserMetadata: map[string]string{MetaReplayOf: rec.GetTrainingRunId()},
		Client:       &loopsv1.ClientInfo{Name: "loops-replay"},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the replay's run: %w", err)
	}
	if op, err = wait(ctx, cl.Operations, op); err != nil {
		return nil, fmt.Errorf("creating the replay's run: %w", err)
	}
	rep.ReplayRunID = op.GetTrainingRunId()
	defer func() { // the replay's run stops holding an adapter; its receipt stays
		if op, err := cl.Training.UnloadTrainingRun(context.WithoutCancel(ctx), &loopsv1.UnloadTrainingRunRequest{Id: rep.ReplayRunID}); err == nil {
			_, _ = wait(context.WithoutCancel(ctx), cl.Operations, op)
		}
	}()
	if run, err := cl.Training.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: rep.ReplayRunID}); err == nil {
		rep.ReplayBaseModelRevision = run.GetBaseModelRevision()
	}
	for _, s := range rec.GetSteps() {
		m, err := replayStep(ctx, cl, rec.GetTrainingRunId(), rep.ReplayRunID, s)
		if err != nil {
			return nil, err
		}
		switch s.GetKind() {
		case loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
			rep.ForwardBackwards++
			rep.Replayed++
		case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
			rep.Replayed++
		}
		if m != nil {
			rep.FirstMismatch = m
			return rep, nil
		}
		if progress != nil {
			progress(rep.Replayed, rep.Steps)
		}
	}
	rep.Matched = true
	return rep, nil
}

// replayStep runs one recorded step on the replay's run; a Mismatch when it differs.
func replayStep(ctx context.Context, cl Clients, runID, replayID string, s *loopsv1.ReceiptStep) (*Mismatch, error) {
	mis := func(reason string) *Mismatch {
		return &Mismatch{SeqID: s.GetSeqId(), Step: s.GetStep(), Kind: s.GetKind().String(), Reason: reason,
			RecordedLoss: s.Loss, RecordedLossBits: bits(s.Loss), RecordedBatchSHA256: s.GetBatchSha256()}
	}
	switch s.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
		b, err := cl.Receipts.GetReceiptBatch(ctx, &loopsv1.GetReceiptBatchRequest{TrainingRunId: runID, SeqId: s.GetSeqId()})
		if err != nil {
			return mis("reading its recorded batch failed: " + err.Error()), nil
		}
		op, err := cl.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{
			TrainingRunId: replayID, Data: b.GetData(), LossFn: s.GetLossFn(), LossFnConfig: s.GetLossFnConfig(),
		})
		if err == nil {
			op, err = wait(ctx, cl.Operations, op)
		}
		m := mis("")
		m.StoredBatchSHA256 = b.GetBatchSha256()
		if err != nil {
			m.Reason = "its forward_backward failed: " + err.Error()
			return m, nil
		}
		if l, ok := op.GetForwardBackward().GetMetrics()["loss:sum"]; ok {
			m.ReplayedLoss, m.ReplayedLossBits = &l, bits(&l)
		}
		switch {
		case s.Loss == nil || m.ReplayedLoss == nil:
			m.Reason = "the loss (loss:sum) is missing from the receipt or the replay"
		case math.Float64bits(*s.Loss) != math.Float64bits(*m.ReplayedLoss):
			m.Reason = "the loss differs"
			if b.GetBatchSha256() != s.GetBatchSha256() {
				m.Reason += "; the stored batch is not the one trained on (its hash differs from the receipt's)"
			}
		default:
			return nil, nil
		}
		return m, nil
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
		op, err := cl.Training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: replayID, Adam: s.GetAdam()})
		if err == nil {
			_, err = wait(ctx, cl.Operations, op)
		}
		if err != nil {
			return mis("its optim_step failed: " + err.Error()), nil
		}
	}
	return nil, nil
}

func bits(v *float64) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%016x", math.Float64bits(*v))
}

// wait waits for an operation to finish; its error is returned as one.
func wait(ctx context.Context, ops loopsv1connect.OperationServiceClient, op *loopsv1.Operation) (*loopsv1.Operation, error) {
	var err error
	for op.GetState() == loopsv1.OperationState_OPERATION_STATE_PENDING || op.GetState() == loopsv1.OperationState_OPERATION_STATE_RUNNING {
		if op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId()}); err != nil {
			return nil, err
		}
	}
	if e := op.GetError(); e != nil {
		return nil, errors.New(e.GetMessage())
	}
	if op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
		return nil, fmt.Errorf("operation %s ended %s", op.GetId(), op.GetState())
	}
	return op, nil
}
