package compat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

type tryAgainResponse struct {
	Type       string `json:"type"`
	RequestID  string `json:"request_id"`
	QueueState string `json:"queue_state"`
	// QueueStateReason says why it waits; the SDK shows it with a paused state.
	QueueStateReason string `json:"queue_state_reason,omitempty"`
}

// tryAgain is the pending answer of an operation: Tinker's queue_state (active,
// paused_capacity, paused_rate_limit) and its reason, as the scheduler reports them
// (loops.v1 Operation.queue).
func tryAgain(id string, q *loopsv1.QueueStatus) tryAgainResponse {
	out := tryAgainResponse{Type: "try_again", RequestID: id, QueueState: "active", QueueStateReason: q.GetReason()}
	switch q.GetState() {
	case loopsv1.QueueState_QUEUE_STATE_PAUSED_CAPACITY:
		out.QueueState = "paused_capacity"
	case loopsv1.QueueState_QUEUE_STATE_PAUSED_RATE_LIMIT:
		out.QueueState = "paused_rate_limit"
	}
	return out
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
		// A client that went away gets nothing (the edge logs it as 499).
		if errs.ClientGone(r.Context()) {
			return err
		}
		// A wait that merely ran out of time is still pending: never answer a 5xx here
		// (the SDK re-polls a 5xx with no delay).
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded || errors.Is(err, context.DeadlineExceeded) ||
			connect.CodeOf(err) == connect.CodeCanceled || r.Context().Err() != nil {
			// (A wait the server canceled, at shutdown say, is re-polled.)
			s.edge.WriteJSON(w, http.StatusOK, tryAgain(req.RequestID, nil))
			return nil
		}
		// An unknown request (never recorded: the server restarted before writing it) and a
		// result that left the result cache are both gone for good: 410, on which the SDK
		// re-submits a sample by itself and surfaces a training call's error to the user.
		if connect.CodeOf(err) == connect.CodeNotFound {
			return &apiError{status: http.StatusGone, code: "not_found",
				detail: "unknown request " + req.RequestID + ": it does not exist, belongs to another API key, finished too long ago, or the server restarted before recording it; resubmit the request"}
		}
		if errs.Reason(err) == errs.ReasonResultExpired {
			return &apiError{status: http.StatusGone, code: "failed_precondition", reason: errs.ReasonResultExpired, detail: errorMessage(err)}
		}
		return err
	}
	switch op.GetState() {
	case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
		return s.writeResult(w, r, op)
	case loopsv1.OperationState_OPERATION_STATE_FAILED, loopsv1.OperationState_OPERATION_STATE_CANCELLED:
		// A cancelled request is a failed one to the SDK (it stopped polling it already).
		s.edge.WriteJSON(w, http.StatusOK, failedResponse{Error: failureMessage(op), Category: failureCategory(op.GetError())})
		return nil
	default:
		s.edge.WriteJSON(w, http.StatusOK, tryAgain(req.RequestID, op.GetQueue()))
		return nil
	}
}

// errorMessage is err's message without the code prefix connect adds.
func errorMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
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
		s.edge.WriteJSON(w, http.StatusOK, map[string]string{"model_id": runIDOf(op)})
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD, loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
		return s.writeLarge(w, r, op, func(asProto bool) ([]byte, error) {
			res := op.GetForwardBackward()
			if asProto {
				out, dropped := forwardBackwardToProto(res)
				s.warnDropped(op, dropped)
				return proto.Marshal(out)
			}
			out, dropped := forwardBackwardToJSON(res)
			s.warnDropped(op, dropped)
			return json.Marshal(out)
		})
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
		metrics, dropped := cleanMetrics(op.GetOptimStep().GetMetrics())
		s.warnDropped(op, dropped)
		s.edge.WriteJSON(w, http.StatusOK, map[string]any{"metrics": metrics})
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
		s.edge.WriteJSON(w, http.StatusOK, out)
	case loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		lw := op.GetLoadWeights()
		out := map[string]string{}
		if lw.GetPath() != "" {
			out["path"] = lw.GetPath()
		}
		if id := lw.GetTrainingRunId(); id != "" {
			out["model_id"] = id
		}
		s.edge.WriteJSON(w, http.StatusOK, out)
	case loopsv1.OperationKind_OPERATION_KIND_SAMPLE:
		return s.writeLarge(w, r, op, func(asProto bool) ([]byte, error) {
			if asProto {
				return proto.Marshal(sampleToProto(op.GetSample()))
			}
			return json.Marshal(sampleToJSON(op.GetSample()))
		})
	case loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN:
		id := op.GetUnload().GetTrainingRunId()
		if id == "" {
			id = op.GetTrainingRunId()
		}
		s.edge.WriteJSON(w, http.StatusOK, map[string]string{"model_id": id})
	default:
		return &apiError{status: http.StatusInternalServerError, code: "internal",
			detail: "operation " + op.GetId() + " has a kind compat cannot encode: " + op.GetKind().String()}
	}
	return nil
}

// resultEncodings is implemented by an operation service that keeps a result's encodings
// with the result (core.OperationService: in its result cache, within the cache's budget).
type resultEncodings interface {
	EncodedResult(id, format string, encode func() ([]byte, error)) ([]byte, error)
}

// writeLarge writes a large result (forward/backward outputs, samples) as protobuf or JSON,
// as the request accepts. The encoding is made once per wire format and kept with the
// result by the core, so a re-poll (the SDK re-polls after a lost answer) costs no encoding.
func (s *server) writeLarge(w http.ResponseWriter, r *http.Request, op *loopsv1.Operation, encode func(asProto bool) ([]byte, error)) error {
	asProto := wantsProto(r)
	format, contentType := "tinker-json", contentTypeJSON
	if asProto {
		format, contentType = "tinker-proto", contentTypeProto
	}
	enc := func() ([]byte, error) { return encode(asProto) }
	var b []byte
	var err error
	if re, ok := s.svc.Operations.(resultEncodings); ok {
		b, err = re.EncodedResult(op.GetId(), format, enc)
	} else {
		b, err = enc()
	}
	if err != nil {
		return fmt.Errorf("encode %s result: %w", format, err)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
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
