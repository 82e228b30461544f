package compat

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// maxCompletionsPerPoll caps the completions one retrieve_futures answer carries (the
// cursor says where the next poll goes on).
const maxCompletionsPerPoll = 1000

// maxRetrievedIDs caps retrieved_request_ids in one retrieve_futures request.
const maxRetrievedIDs = 10000

// clonedSamplerSpan is the seq_id range of one cloned SamplingClient: the SDK numbers a
// clone's samples from cloned_sampler_id × 10⁹.
const clonedSamplerSpan = 1_000_000_000

// cancelFuture cancels a request (the SDK sends it for a sampling future it abandoned, when
// the dynamic config's sample_cancel_enabled is on): a queued one is removed, a running one
// finishes with its result dropped, a finished one is unchanged (loops.v1 CancelOperation).
func (s *server) cancelFuture(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		RequestID string `json:"request_id"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if req.RequestID == "" {
		return badRequest("request_id is required: the id the request was answered with")
	}
	if _, err := s.svc.Operations.CancelOperation(r.Context(), &loopsv1.CancelOperationRequest{Id: req.RequestID}); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

// completionSource is implemented by an operation service that reports a sampler's
// finished samples in the order they finished (core.OperationService).
type completionSource interface {
	Completions(ctx context.Context, samplerID string, after int64, wait time.Duration, limit int) ([]*loopsv1.Operation, int64, error)
}

// futureCompletion is one entry of retrieve_futures' completions: Tinker's FutureFinished
// (state "finished") or FutureFailed (state "failed": failed or cancelled).
type futureCompletion struct {
	State     string `json:"state"`
	RequestID string `json:"request_id"`
}

// retrieveFutures long-polls a sampling session's completions: the samples that finished
// after prev_cursor, waiting up to timeout (the long-poll time when null, none when 0) for
// the first one. The SDK then fetches each result with retrieve_future.
func (s *server) retrieveFutures(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Target struct {
			Type              string      `json:"type"`
			SamplingSessionID string      `json:"sampling_session_id"`
			ClonedSamplerID   json.Number `json:"cloned_sampler_id"`
		} `json:"target"`
		PrevCursor          json.Number `json:"prev_cursor"`
		Timeout             *float64    `json:"timeout"`
		RetrievedRequestIDs []string    `json:"retrieved_request_ids"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	src, ok := s.svc.Operations.(completionSource)
	if !ok {
		return notImplemented("retrieve_futures needs the server's operation core")
	}
	if req.Target.Type != "" && req.Target.Type != "sampling_session" {
		return badRequest("target.type %q is not one Loops knows: the only target is \"sampling_session\"", req.Target.Type)
	}
	if req.Target.SamplingSessionID == "" {
		return badRequest("target.sampling_session_id is required: the sampling session to poll")
	}
	clone, err := wireInt(req.Target.ClonedSamplerID, "target.cloned_sampler_id", 0, math.MaxInt64/clonedSamplerSpan)
	if err != nil {
		return err
	}
	after, err := wireInt(req.PrevCursor, "prev_cursor", 0, math.MaxInt64)
	if err != nil {
		return err
	}
	if len(req.RetrievedRequestIDs) > maxRetrievedIDs {
		return badRequest("retrieved_request_ids has %d ids, more than %d: report them over several polls", len(req.RetrievedRequestIDs), maxRetrievedIDs)
	}
	wait := s.opt.LongPoll
	if t := req.Timeout; t != nil {
		if math.IsNaN(*t) || *t < 0 {
			return badRequest("timeout must be a number of seconds, 0 or more (null: the server's long poll)")
		}
		if d := *t * float64(time.Second); d < float64(wait) { // (a huge one would overflow a Duration)
			wait = time.Duration(d)
		}
	}
	// Results stay in the result cache until it evicts them by its own budget and TTL;
	// retrieved_request_ids needs no work here.
	done, cursor, err := src.Completions(r.Context(), req.Target.SamplingSessionID, after, wait, maxCompletionsPerPoll)
	if err != nil {
		return err
	}
	out := struct {
		Completions []futureCompletion `json:"completions"`
		Cursor      int64              `json:"cursor"`
	}{Completions: []futureCompletion{}, Cursor: cursor}
	for _, c := range done {
		if c.GetSeqId()/clonedSamplerSpan != clone {
			continue // another clone's sample: its own poller reports it
		}
		state := "failed"
		if c.GetState() == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
			state = "finished"
		}
		out.Completions = append(out.Completions, futureCompletion{State: state, RequestID: c.GetId()})
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

// wireInt parses a JSON integer field (empty: 0) within [lo, hi].
func wireInt(n json.Number, field string, lo, hi int64) (int64, error) {
	if n == "" {
		return 0, nil
	}
	v, err := n.Int64()
	if err != nil || v < lo || v > hi {
		return 0, badRequest("%s must be an integer from %d to %d, not %s", field, lo, hi, n.String())
	}
	return v, nil
}
