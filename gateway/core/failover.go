package core

import loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"

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
