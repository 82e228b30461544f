package core_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// lossyReplicas is a test backend of two replicas, each its own reference engine, that
// loses a replica at a chosen call: the engine is replaced by a new one (holding nothing),
// the adapters bound to it are gone (NotFound), and the call — before or after doing its
// work — and any other call in flight on it fail Unavailable, as a preempted worker's do.
// It is preemptible, so the core keeps step recovery for its runs.
type lossyReplicas struct {
	backendv1connect.UnimplementedTrainerServiceHandler
	dir string

	mu      sync.Mutex
	engines []*reference.Engine
	gens    []int
	bound   map[string]int
	calls   int
	// killAt is the adapter call (counted from 1) whose replica is lost; afterCall: once the
	// call did its work (its answer is lost), else before it starts.
	killAt    int
	afterCall bool
	killed    string // the call that was hit
}

func newLossyReplicas(t *testing.T, dir string, killAt int, afterCall bool) *lossyReplicas {
	l := &lossyReplicas{dir: dir, bound: map[string]int{}, killAt: killAt, afterCall: afterCall}
	for range 2 {
		l.engines = append(l.engines, l.newEngine(t))
		l.gens = append(l.gens, 0)
	}
	return l
}

func (l *lossyReplicas) newEngine(t *testing.T) *reference.Engine {
	e, err := reference.New(reference.Options{DataDir: l.dir, Threads: 1})
	require.NoError(t, err)
	return e
}

func (l *lossyReplicas) Trainer() backends.Trainer     { return l }
func (l *lossyReplicas) Sampler() backends.Sampler     { return l.engines[0] }
func (l *lossyReplicas) Close() error                  { return nil }
func (l *lossyReplicas) Preemptible(model string) bool { return model == tiny.Name }

func (l *lossyReplicas) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return l.engines[0].GetCapabilities(ctx, req)
}

var errLost = connect.NewError(connect.CodeUnavailable, errors.New("the replica was preempted"))

// lose replaces replica i by a new engine. Called with l.mu held.
func (l *lossyReplicas) lose(i int) {
	e, err := reference.New(reference.Options{DataDir: l.dir, Threads: 1})
	if err != nil {
		panic(err)
	}
	l.engines[i] = e
	l.gens[i]++
	for id, r := range l.bound {
		if r == i {
			delete(l.bound, id)
		}
	}
}

// do runs one call on replica i, losing the replica when it is the chosen call.
func (l *lossyReplicas) do(i int, what string, f func(e *reference.Engine) error) error {
	l.mu.Lock()
	l.calls++
	kill := l.calls == l.killAt
	if kill {
		l.killed = fmt.Sprintf("%s (call %d, after its work: %v)", what, l.calls, l.afterCall)
	}
	if kill && !l.afterCall {
		l.lose(i)
		l.mu.Unlock()
		return errLost
	}
	e, gen := l.engines[i], l.gens[i]
	l.mu.Unlock()
	err := f(e)
	l.mu.Lock()
	defer l.mu.Unlock()
	if kill {
		l.lose(i)
	}
	if l.gens[i] != gen {
		return errLost
	}
	return err
}

// replica is the replica holding adapter id.
func (l *lossyReplicas) replica(id string) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.bound[id]
	if !ok {
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("adapter %q does not exist", id))
	}
	return i, nil
}

func (l *lossyReplicas) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	l.mu.Lock()
	n := []int{0, 0}
	for _, r := range l.bound {
		n[r]++
	}
	i := 0
	if n[1] < n[0] {
		i = 1
	}
	l.mu.Unlock()
	var resp *backendv1.CreateAdapterResponse
	err := l.do(i, "CreateAdapter", func(e *reference.Engine) (err error) {
		resp, err = e.CreateAdapter(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.bound[req.GetAdapterId()] = i
	l.mu.Unlock()
	return resp, nil
}

func (l *lossyReplicas) DeleteAdapter(ctx context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	i, err := l.replica(req.GetAdapterId())
	if err != nil {
		return &backendv1.DeleteAdapterResponse{}, nil
	}
	l.mu.Lock()
	delete(l.bound, req.GetAdapterId())
	e := l.engines[i]
	l.mu.Unlock()
	return e.DeleteAdapter(ctx, req)
}

func (l *lossyReplicas) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	out := &backendv1.ForwardBackwardResponse{Results: make([]*backendv1.ForwardBackwardItemResult, len(req.GetItems()))}
	for k, it := range req.GetItems() { // one call per item, as a replica each
		i, err := l.replica(it.GetAdapterId())
		if err == nil {
			err = l.do(i, "ForwardBackward", func(e *reference.Engine) error {
				resp, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{it}})
				if err == nil {
					out.Results[k] = resp.GetResults()[0]
				}
				return err
			})
		}
		if err != nil {
			out.Results[k] = &backendv1.ForwardBackwardItemResult{Outcome: &backendv1.ForwardBackwardItemResult_Error{
				Error: &backendv1.ItemError{Code: int32(connect.CodeOf(err)), Message: err.Error()}}}
		}
	}
	return out, nil
}

func (l *lossyReplicas) OptimStep(ctx context.Context, req *backendv1.OptimStepRequest) (resp *backendv1.OptimStepResponse, err error) {
	i, err := l.replica(req.GetAdapterId())
	if err != nil {
		return nil, err
	}
	err = l.do(i, "OptimStep", func(e *reference.Engine) (err error) {
		resp, err = e.OptimStep(ctx, req)
		return err
	})
	return resp, err
}

func (l *lossyReplicas) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (resp *backendv1.SaveAdapterResponse, err error) {
	i, err := l.replica(req.GetAdapterId())
	if err != nil {
		return nil, err
	}
	err = l.do(i, "SaveAdapter", func(e *reference.Engine) (err error) {
		resp, err = e.SaveAdapter(ctx, req)
		return err
	})
	return resp, err
}

func (l *lossyReplicas) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (resp *backendv1.LoadAdapterResponse, err error) {
	i, err := l.replica(req.GetAdapterId())
	if err != nil {
		return nil, err
	}
	err = l.do(i, "LoadAdapter", func(e *reference.Engine) (err error) {
		resp, err = e.LoadAdapter(ctx, req)
		return err
	})
	return resp, err
}

// TestLostReplicaLosesNoStep: two runs train (three steps of two forward_backward calls,
// one more forward_backward, a save) on two replicas that are preemptible. A replica is
// lost at each backend call in turn — before the call does its work, and after it did it
// but before it answered — and every time each run's losses, optim_step metrics, final
// weights and Adam state are bit-identical to an uninterrupted run on one engine: the core
// rebuilt the adapter from its last step snapshot, replayed the calls since, and ran the
// failed call again.
func TestLostReplicaLosesNoStep(t *testing.T) {
	const k = 2
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 1})
	require.NoError(t, err)
	want := trainRuns(t, dir, eng, k, nil)

	// Count the calls of a run without losses, and check it matches too.
	dry := newLossyReplicas(t, t.TempDir(), 0, false)
	require.NoError(t, tiny.Write(filepath.Join(dry.dir, "models", "loops-tiny")))
	require.Equal(t, want, trainRuns(t, dry.dir, dry, k, nil))
	calls := dry.calls
	require.Greater(t, calls, 20)

	hit := 0
	var mu sync.Mutex
	t.Run("lost", func(t *testing.T) {
		for killAt := 1; killAt <= calls; killAt++ {
			for _, after := range []bool{false, true} {
				t.Run(fmt.Sprintf("call%d-after%v", killAt, after), func(t *testing.T) {
					t.Parallel()
					d := t.TempDir()
					require.NoError(t, tiny.Write(filepath.Join(d, "models", "loops-tiny")))
					l := newLossyReplicas(t, d, killAt, after)
					got := trainRuns(t, d, l, k, nil)
					if l.killed == "" {
						return // this run made fewer calls (snapshots race the next step)
					}
					mu.Lock()
					hit++
					mu.Unlock()
					for i := range k {
						require.Equal(t, want[i].losses, got[i].losses, "run %d losses, replica lost at %s", i, l.killed)
						require.Equal(t, want[i].steps, got[i].steps, "run %d optim_step metrics, replica lost at %s", i, l.killed)
						require.Equal(t, want[i].weights, got[i].weights, "run %d weights, replica lost at %s", i, l.killed)
						require.Equal(t, want[i].optimizer, got[i].optimizer, "run %d Adam state, replica lost at %s", i, l.killed)
					}
				})
			}
		}
	})
	t.Logf("%d backend calls in a run without losses; a replica lost at %d of %d points", calls, hit, 2*calls)
	require.Greater(t, hit, calls)
}
