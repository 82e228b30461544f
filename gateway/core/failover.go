package core

import (
	"fmt"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Messages of the operations that a start-up finds unfinished (New): the process that ran
// them is gone, restarted here or failed over to this gateway (Options.TookOver).
const (
	restartedMessage  = "the server restarted while this operation was in flight; its effect is unknown: reload the run's last checkpoint (load_state) and resubmit"
	failedOverMessage = "the gateway failed over to a standby while this operation was in flight; its effect is unknown: reload the run's last checkpoint (load_state) and resubmit"
)

// unfinishedError is the error given to operations left unfinished by the previous leader
// or process.
func unfinishedError(tookOver bool) *loopsv1.OperationError {
	msg := restartedMessage
	if tookOver {
		msg = failedOverMessage
	}
	return &loopsv1.OperationError{
		Code:     14, // Unavailable
		Message:  msg,
		Category: loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER,
	}
}

// failedOverRun fails the first task of a run whose adapter a takeover recreated, unless it
// loads a checkpoint: the client must hear that the run's unsaved state is gone (a fresh
// adapter would otherwise train on silently, as from step 0). Later tasks run on the
// recreated adapter, marked corrupted, as after a restart. Without a takeover it is nil.
func (c *Core) failedOverRun(runID string, info *loopsv1.TrainingRun, t *task) error {
	if !c.opts.TookOver || t.Op == nil || t.Op.snapshot().GetKind() == loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS {
		return nil
	}
	hint := "load the run's last checkpoint (load_state)"
	if p := info.GetLastCheckpoint().GetTinkerPath(); p != "" {
		hint = fmt.Sprintf("load its last checkpoint (load_state %s)", p)
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
		"the gateway failed over to a standby and training run %s's unsaved state (since its last checkpoint) is lost: %s and resubmit", runID, hint))
}
