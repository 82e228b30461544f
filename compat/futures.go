package compat

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

type tryAgainResponse struct {
	Type       string `json:"type"`
	RequestID  string `json:"request_id"`
	QueueState string `json:"queue_state"`
}

type failedResponse struct {
	Error    string `json:"error"`
	Category string `json:"category"`
}

// retrieveFuture long-polls an operation: it waits up to LongPoll for the result, then
// answers try_again (which the SDK re-polls at once), the failure, or the result in the
// shape the awaited SDK type expects.
func (s *server) retrieveFuture(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		RequestID         string `json:"request_id"`
		AllowMetadataOnly bool   `json:"allow_metadata_only"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.RequestID == "" {
		return badRequest("request_id is required")
	}
	op, err := s.svc.Operations.WaitOperation(r.Context(), &loopsv1.WaitOperationRequest{
		Id: req.RequestID, Timeout: durationpb.New(s.opt.LongPoll),
	})
	if err != nil {
		// A client that went away gets nothing (writeError logs it as 499).
		if errs.ClientGone(r.Context()) {
			return err
		}
		// A wait that merely ran out of time is still pending: never answer a 5xx here
		// (the SDK re-polls a 5xx with no delay).
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded || errors.Is(err, context.DeadlineExceeded) ||
			connect.CodeOf(err) == connect.CodeCanceled || r.Context().Err() != nil {
			// (A wait the server canceled, at shutdown say, is re-polled.)
			writeJSON(w, http.StatusOK, tryAgainResponse{Type: "try_again", RequestID: req.RequestID, QueueState: "active"})
			return nil
		}
		if connect.CodeOf(err) == connect.CodeNotFound {
			return &apiError{status: http.StatusNotFound, code: "not_found",
				detail: "request " + req.RequestID + " is unknown or its result has expired"}
		}
		return err
	}
	switch op.GetState() {
	case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
		return s.writeResult(w, r, op)
	case loopsv1.OperationState_OPERATION_STATE_FAILED:
		writeJSON(w, http.StatusOK, failedResponse{Error: failureMessage(op), Category: failureCategory(op.GetError())})
		return nil
	default:
		writeJSON(w, http.StatusOK, tryAgainResponse{Type: "try_again", RequestID: req.RequestID, QueueState: "active"})
		return nil
	}
}

func failureMessage(op *loopsv1.Operation) string {
	if m := op.GetError().GetMessage(); m != "" {
		return m
	}
	return "the request failed without an error message"
}

// failureCategory maps the core's category; an unset one is derived from the error code.
func failureCategory(e *loopsv1.OperationError) string {
	switch e.GetCategory() {
	case loopsv1.ErrorCategory_ERROR_CATEGORY_USER:
		return "user"
	case loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER:
		return "server"
	}
	if e.GetCode() != 0 && errs.Lookup(connect.Code(e.GetCode())).Category == errs.User {
		return "user"
	}
	return "server"
}

// saveResult is the JSON result of save_weights and save_weights_for_sampler.
type saveResult struct {
	Path              string `json:"path,omitempty"`
	SamplingSessionID string `json:"sampling_session_id,omitempty"`
}

// writeResult encodes a succeeded operation's result per kind.
func (s *server) writeResult(w http.ResponseWriter, r *http.Request, op *loopsv1.Operation) error {
	switch op.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN:
		writeJSON(w, http.StatusOK, map[string]string{"model_id": runIDOf(op)})
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD, loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
		res := op.GetForwardBackward()
		if wantsProto(r) {
			out, dropped := forwardBackwardToProto(res)
			s.warnDropped(op, dropped)
			return writeProto(w, out)
		}
		out, dropped := forwardBackwardToJSON(res)
		s.warnDropped(op, dropped)
		writeJSON(w, http.StatusOK, out)
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
		metrics, dropped := cleanMetrics(op.GetOptimStep().GetMetrics())
		s.warnDropped(op, dropped)
		writeJSON(w, http.StatusOK, map[string]any{"metrics": metrics})
	case loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS, loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER:
		sw := op.GetSaveWeights()
		out := saveResult{Path: sw.GetPath(), SamplingSessionID: sw.GetSamplerId()}
		if out.Path == "" {
			out.Path = sw.GetCheckpoint().GetTinkerPath()
		}
		if out.SamplingSessionID != "" {
			// An unnamed sampler save answers with the sampler only: tinker 0.18 asserts
			// that such a result has no path.
			out.Path = ""
		}
		writeJSON(w, http.StatusOK, out)
	case loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		lw := op.GetLoadWeights()
		out := map[string]string{}
		if lw.GetPath() != "" {
			out["path"] = lw.GetPath()
		}
		if id := lw.GetTrainingRunId(); id != "" {
			out["model_id"] = id
		}
		writeJSON(w, http.StatusOK, out)
	case loopsv1.OperationKind_OPERATION_KIND_SAMPLE:
		if wantsProto(r) {
			return writeProto(w, sampleToProto(op.GetSample()))
		}
		writeJSON(w, http.StatusOK, sampleToJSON(op.GetSample()))
	case loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN:
		id := op.GetUnload().GetTrainingRunId()
		if id == "" {
			id = op.GetTrainingRunId()
		}
		writeJSON(w, http.StatusOK, map[string]string{"model_id": id})
	default:
		return &apiError{status: http.StatusInternalServerError, code: "internal",
			detail: "operation " + op.GetId() + " has a kind compat cannot encode: " + op.GetKind().String()}
	}
	return nil
}

func (s *server) warnDropped(op *loopsv1.Operation, dropped []string) {
	if len(dropped) > 0 {
		s.log.Warn("compat: dropped metrics whose keys are not name:reduction", "request_id", op.GetId(), "keys", dropped)
	}
}

// runIDOf is the training run an operation belongs to or created.
func runIDOf(op *loopsv1.Operation) string {
	if id := op.GetTrainingRunId(); id != "" {
		return id
	}
	return op.GetTrainingRun().GetId()
}
