package compat

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestCancelFuture: cancel_future cancels through loops.v1 CancelOperation, and a
// cancelled request then reads as a failed one (category user) on retrieve_future.
func TestCancelFuture(t *testing.T) {
	e := newEnv(t)
	op := e.core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 0)
	r := e.postJSON("/api/v1/cancel_future", fmt.Sprintf(`{"request_id":%q}`, op.GetId()))
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, `{}`, string(r.body))
	r = e.postJSON("/api/v1/retrieve_future", fmt.Sprintf(`{"request_id":%q}`, op.GetId()))
	require.Equal(t, 200, r.status)
	require.Equal(t, "user", r.json(t)["category"])
	require.Contains(t, r.json(t)["error"], "cancelled")

	require.Equal(t, 400, e.postJSON("/api/v1/cancel_future", `{}`).status)
	require.Equal(t, 404, e.postJSON("/api/v1/cancel_future", `{"request_id":"op-nope"}`).status)
}

// TestRetrieveFutures: a sampling session's finished requests (finished or failed), from
// the cursor on, only the asked clone's, and every wire field range-checked.
func TestRetrieveFutures(t *testing.T) {
	e := newEnv(t)
	e.core.samplers["smp"] = &loopsv1.Sampler{Id: "smp"}
	ok := e.core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 1)
	bad := e.core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 2)
	clone := e.core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 1_000_000_001)
	pending := e.core.newOp(loopsv1.OperationKind_OPERATION_KIND_SAMPLE, "", "smp", 3)
	e.core.finish(ok.GetId(), func(*loopsv1.Operation) {})
	e.core.finish(bad.GetId(), func(op *loopsv1.Operation) { op.State = loopsv1.OperationState_OPERATION_STATE_FAILED })
	e.core.finish(clone.GetId(), func(*loopsv1.Operation) {})
	_ = pending

	r := e.postJSON("/api/v1/retrieve_futures", `{"target":{"type":"sampling_session","sampling_session_id":"smp","cloned_sampler_id":0},"prev_cursor":0,"timeout":0,"retrieved_request_ids":[]}`)
	require.Equal(t, 200, r.status, string(r.body))
	require.JSONEq(t, fmt.Sprintf(`{"completions":[{"state":"finished","request_id":%q},{"state":"failed","request_id":%q}],"cursor":3}`, ok.GetId(), bad.GetId()), string(r.body))

	r = e.postJSON("/api/v1/retrieve_futures", `{"target":{"type":"sampling_session","sampling_session_id":"smp","cloned_sampler_id":1},"prev_cursor":0,"timeout":0}`)
	require.JSONEq(t, fmt.Sprintf(`{"completions":[{"state":"finished","request_id":%q}],"cursor":3}`, clone.GetId()), string(r.body))

	r = e.postJSON("/api/v1/retrieve_futures", `{"target":{"sampling_session_id":"smp"},"prev_cursor":3,"timeout":0}`)
	require.JSONEq(t, `{"completions":[],"cursor":3}`, string(r.body))

	for _, body := range []string{
		`{"target":{"sampling_session_id":""}}`,
		`{"target":{"type":"training_run","sampling_session_id":"smp"}}`,
		`{"target":{"sampling_session_id":"smp","cloned_sampler_id":-1}}`,
		`{"target":{"sampling_session_id":"smp"},"prev_cursor":-5}`,
		`{"target":{"sampling_session_id":"smp"},"prev_cursor":1.5}`,
		`{"target":{"sampling_session_id":"smp"},"timeout":-1}`,
	} {
		r := e.postJSON("/api/v1/retrieve_futures", body)
		require.Equal(t, 400, r.status, body)
	}
	require.Equal(t, 404, e.postJSON("/api/v1/retrieve_futures", `{"target":{"sampling_session_id":"other"},"timeout":0}`).status)
}
