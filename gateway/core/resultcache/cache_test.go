package resultcache

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// clock is a settable time source.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func fbOp(id string, outputs int) *loopsv1.Operation {
	var outs []*loopsv1.DatumOutput
	for range outputs {
		outs = append(outs, &loopsv1.DatumOutput{})
	}
	return &loopsv1.Operation{
		Id: id, Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
		State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		Result: &loopsv1.Operation_ForwardBackward{ForwardBackward: &loopsv1.ForwardBackwardResult{
			Outputs: outs, Metrics: map[string]float64{"loss:sum": 1},
		}},
	}
}

// TestHasLargeAndSmall: only succeeded forward, forward_backward and sample operations have
// a large result; Small drops per-token outputs and sequences, keeps the metrics, and leaves
// the operation it was given as it was.
func TestHasLargeAndSmall(t *testing.T) {
	op := fbOp("op-1", 3)
	require.True(t, HasLarge(op))
	small := Small(op)
	require.Empty(t, small.GetForwardBackward().GetOutputs())
	require.Equal(t, map[string]float64{"loss:sum": 1}, small.GetForwardBackward().GetMetrics())
	require.Len(t, op.GetForwardBackward().GetOutputs(), 3, "the full result is unchanged")

	sample := &loopsv1.Operation{Id: "op-2", Kind: loopsv1.OperationKind_OPERATION_KIND_SAMPLE, State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		Result: &loopsv1.Operation_Sample{Sample: &loopsv1.SampleResult{Sequences: []*loopsv1.SampledSequence{{}}}}}
	require.True(t, HasLarge(sample))
	require.Empty(t, Small(sample).GetSample().GetSequences())

	failed := fbOp("op-3", 1)
	failed.State = loopsv1.OperationState_OPERATION_STATE_FAILED
	require.False(t, HasLarge(failed))
	require.Same(t, failed, Small(failed))
	optim := &loopsv1.Operation{Id: "op-4", Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED}
	require.False(t, HasLarge(optim))
	require.Same(t, optim, Small(optim))
}

// TestCacheKeepsWithinItsByteBudget: results leave oldest first once newer ones need the
// room; one larger than the whole budget is not kept; putting an id again replaces it.
func TestCacheKeepsWithinItsByteBudget(t *testing.T) {
	one := int64(proto.Size(fbOp("op-1", 4)))
	c := New(2*one+one/2, time.Hour, newClock().now) // room for two
	for i := 1; i <= 3; i++ {
		require.True(t, c.Put(fbOp(fmt.Sprintf("op-%d", i), 4)))
	}
	bytes, n := c.Usage()
	require.Equal(t, 2, n)
	require.Equal(t, 2*one, bytes)
	_, ok := c.Get("op-1")
	require.False(t, ok, "the oldest left first")
	got, ok := c.Get("op-3")
	require.True(t, ok)
	require.Empty(t, cmp.Diff(fbOp("op-3", 4), got, protocmp.Transform()))

	require.True(t, c.Put(fbOp("op-3", 4)), "again: replaced, not counted twice")
	bytes, n = c.Usage()
	require.Equal(t, 2, n)
	require.Equal(t, 2*one, bytes)

	require.False(t, c.Put(fbOp("op-huge", 1000)), "larger than the whole budget")
	_, ok = c.Get("op-huge")
	require.False(t, ok)
	_, n = c.Usage()
	require.Equal(t, 2, n, "a result that does not fit evicts nothing")
}

// TestCacheKeepsForItsTTL: a result is answered within the TTL, not after it; Sweep drops
// what has passed it and keeps the rest.
func TestCacheKeepsForItsTTL(t *testing.T) {
	clk := newClock()
	c := New(1<<20, time.Minute, clk.now)
	require.True(t, c.Put(fbOp("old", 1)))
	clk.add(40 * time.Second)
	require.True(t, c.Put(fbOp("new", 1)))
	clk.add(30 * time.Second) // old: 70 s, new: 30 s
	_, ok := c.Get("old")
	require.False(t, ok, "past the TTL")
	_, ok = c.Get("new")
	require.True(t, ok)

	require.True(t, c.Put(fbOp("old", 1))) // put again: a fresh entry
	clk.add(45 * time.Second)              // old: 45 s, new: 75 s
	c.Sweep()
	_, n := c.Usage()
	require.Equal(t, 1, n)
	_, ok = c.Get("old")
	require.True(t, ok)
}

// TestEncodedOnce: an encoding of a kept result is made once and counts against the budget
// (evicting older entries, never its own); one of a result not kept, or that would not fit
// with it, is made every time and not kept; an encoding error is returned and not kept.
func TestEncodedOnce(t *testing.T) {
	one := int64(proto.Size(fbOp("op-1", 4)))
	c := New(2*one+one/2, time.Hour, newClock().now)
	require.True(t, c.Put(fbOp("op-1", 4)))
	require.True(t, c.Put(fbOp("op-2", 4)))
	calls := 0
	enc := func(size int64) func() ([]byte, error) {
		return func() ([]byte, error) { calls++; return make([]byte, size), nil }
	}
	for range 3 {
		b, err := c.Encoded("op-1", "json", enc(one))
		require.NoError(t, err)
		require.Len(t, b, int(one))
	}
	require.Equal(t, 1, calls)
	bytes, n := c.Usage()
	require.Equal(t, 1, n, "op-1 and its encoding need the room of op-2")
	require.Equal(t, 2*one, bytes)
	_, ok := c.Get("op-1")
	require.True(t, ok, "the oldest entry, but the one being encoded: kept")

	calls = 0
	for range 2 {
		_, err := c.Encoded("op-1", "proto", enc(2*one))
		require.NoError(t, err)
	}
	require.Equal(t, 2, calls, "it would not fit with its result: not kept")
	calls = 0
	for range 2 {
		_, err := c.Encoded("op-gone", "json", enc(10))
		require.NoError(t, err)
	}
	require.Equal(t, 2, calls, "a result not in the cache is encoded every time")

	boom := errors.New("boom")
	_, err := c.Encoded("op-1", "text", func() ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	after, _ := c.Usage()
	require.Equal(t, bytes, after)
}

// TestErrExpired: FailedPrecondition with reason RESULT_EXPIRED, naming the operation, its
// kind and the cache's budgets, and telling the client to rerun the step.
func TestErrExpired(t *testing.T) {
	c := New(64<<20, 90*time.Minute, time.Now)
	err := c.ErrExpired(fbOp("op-7", 1), "forward_backward")
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Equal(t, errs.ReasonResultExpired, errs.Reason(err))
	for _, want := range []string{"result expired", "op-7", "forward_backward", "1h30m0s", "64 MiB", "rerun the step"} {
		require.ErrorContains(t, err, want)
	}
}
