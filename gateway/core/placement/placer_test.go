package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// fakeScaler records what it is asked to place; it places n (at least 1), or answers ok
// and err as set, and holds each call while gate is set.
type fakeScaler struct {
	mu    sync.Mutex
	asks  []string // "base=n"
	notOK bool
	err   error
	gate  chan struct{}
}

func (s *fakeScaler) ScaleSamplers(ctx context.Context, base string, n int) (int, bool, error) {
	s.mu.Lock()
	s.asks = append(s.asks, fmt.Sprintf("%s=%d", base, n))
	gate, notOK, err := s.gate, s.notOK, s.err
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, true, ctx.Err()
		}
	}
	if notOK {
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	return max(n, 1), true, nil
}

func (s *fakeScaler) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.asks) == 0 {
		return ""
	}
	return s.asks[len(s.asks)-1]
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// start runs p until the test ends.
func start(t *testing.T, p *Placer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func deployment(owner, name, base string, replicas int32) *loopsv1.Deployment {
	return &loopsv1.Deployment{Owner: owner, Name: name, BaseModel: base, Replicas: replicas}
}

// placed waits until d's placement is no longer being made and returns d's view.
func placed(t *testing.T, p *Placer, d *loopsv1.Deployment) *loopsv1.Deployment {
	t.Helper()
	var v *loopsv1.Deployment
	require.Eventually(t, func() bool {
		v = p.View(d)
		return v.GetPlacement() != "placing…"
	}, 10*time.Second, time.Millisecond)
	return v
}

// TestPlacerPlacesTheMostAnyDeploymentAsks: a model's pool is scaled to the most replicas
// its deployments want, down when they go, and back to the backend's own count when none
// is left; each deployment sees the replicas placed for it, never more than it asked for;
// View leaves the deployment it was given as it was.
func TestPlacerPlacesTheMostAnyDeploymentAsks(t *testing.T) {
	s := &fakeScaler{}
	p := New(s, quiet())
	start(t, p)
	big, small, other := deployment("ws-1", "big", "m", 3), deployment("ws-2", "small", "m", 2), deployment("ws-1", "other", "n", 1)
	for _, d := range []*loopsv1.Deployment{big, small, other} {
		p.Set(d.GetBaseModel(), d.GetOwner(), d.GetName(), d.GetReplicas())
	}
	require.EqualValues(t, 3, placed(t, p, big).GetPlacedReplicas())
	v := placed(t, p, small)
	require.EqualValues(t, 2, v.GetPlacedReplicas(), "its own share, not the pool's size")
	require.Contains(t, v.GetPlacement(), "2 sampler replicas placed")
	require.Empty(t, small.GetPlacement(), "View returns a copy")
	require.EqualValues(t, 1, placed(t, p, other).GetPlacedReplicas())
	s.mu.Lock()
	require.Contains(t, s.asks, "m=3")
	require.NotContains(t, s.asks, "m=2")
	s.mu.Unlock()

	p.Remove("ws-1", "big")
	require.Eventually(t, func() bool { return s.last() == "m=2" }, 10*time.Second, time.Millisecond)
	p.Remove("ws-2", "small")
	require.Eventually(t, func() bool { return s.last() == "m=1" }, 10*time.Second, time.Millisecond, "no deployment left: the backend's own count")
}

// TestPlacerSaysPlacingUntilPlaced: while a model's wish is being placed its deployments
// say "placing…"; a wish that changes meanwhile is placed next.
func TestPlacerSaysPlacingUntilPlaced(t *testing.T) {
	s := &fakeScaler{gate: make(chan struct{})}
	p := New(s, quiet())
	start(t, p)
	d := deployment("ws", "d", "m", 2)
	p.Set("m", "ws", "d", 2)
	require.Eventually(t, func() bool { return s.last() == "m=2" }, 10*time.Second, time.Millisecond)
	require.Equal(t, "placing…", p.View(d).GetPlacement())
	p.Set("m", "ws", "d", 4)
	d.Replicas = 4
	close(s.gate)
	require.Eventually(t, func() bool { return s.last() == "m=4" }, 10*time.Second, time.Millisecond)
	require.EqualValues(t, 4, placed(t, p, d).GetPlacedReplicas())
}

// TestPlacerSaysWhyNoneArePlaced: a backend that places no replicas, one whose workers are
// fixed, and a placement that failed (its message, without the error's code) each say so.
func TestPlacerSaysWhyNoneArePlaced(t *testing.T) {
	d := deployment("ws", "d", "m", 3)
	for _, tc := range []struct {
		name   string
		scaler *fakeScaler
		want   string
	}{
		{"no scaler", nil, "this backend runs one sampler for every deployment and places no replicas"},
		{"fixed workers", &fakeScaler{notOK: true}, "the backend's workers are fixed at start-up (no worker pools): no replicas are placed"},
		{"failed", &fakeScaler{err: connect.NewError(connect.CodeUnavailable, errors.New("no capacity"))}, "placing 3 replicas failed: no capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p *Placer
			if tc.scaler == nil {
				p = New(nil, quiet())
			} else {
				p = New(tc.scaler, quiet())
			}
			start(t, p)
			p.Set("m", "ws", "d", 3)
			v := placed(t, p, d)
			require.Zero(t, v.GetPlacedReplicas())
			require.Equal(t, tc.want, v.GetPlacement())
		})
	}
}

// TestPlacerLoadsEveryDeployment: Load lists every stored deployment in keyset pages and
// marks their models for placing; a list that fails is reported.
func TestPlacerLoadsEveryDeployment(t *testing.T) {
	var all []*loopsv1.Deployment
	for i := range 1203 {
		all = append(all, deployment(fmt.Sprintf("ws-%04d", i), "d", fmt.Sprintf("m%d", i%3), int32(1+i%5)))
	}
	var pages []string
	list := func(_ context.Context, afterWS, afterName string, limit int) ([]*loopsv1.Deployment, error) {
		pages = append(pages, afterWS+"/"+afterName)
		i := 0
		if afterWS != "" {
			i = slices.IndexFunc(all, func(d *loopsv1.Deployment) bool { return d.GetOwner() == afterWS && d.GetName() == afterName }) + 1
		}
		return all[i:min(i+limit, len(all))], nil
	}
	s := &fakeScaler{}
	p := New(s, quiet())
	require.NoError(t, p.Load(t.Context(), list))
	require.Equal(t, []string{"/", "ws-0499/d", "ws-0999/d"}, pages)
	start(t, p)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.asks) == 3
	}, 10*time.Second, time.Millisecond)
	s.mu.Lock()
	asks := slices.Sorted(slices.Values(s.asks))
	s.mu.Unlock()
	require.Equal(t, []string{"m0=5", "m1=5", "m2=5"}, asks)

	boom := errors.New("boom")
	err := New(s, quiet()).Load(t.Context(), func(context.Context, string, string, int) ([]*loopsv1.Deployment, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
}
