package core

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core/trainrun"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// bareRun is a run with no core behind it: enough for the registry.
func bareRun(id, session string, clientSeq int64, unloaded string) *run {
	return trainrun.New(trainrun.Config[*operation]{Workspace: "ws", Record: &loopsv1.TrainingRun{Id: id, SessionId: session, ClientSeqId: &clientSeq},
		NextSeq: 1, MaxPending: 4, Unloaded: unloaded})
}

// TestRunRegistry: the registry finds runs by id and alias, reloads a missing one through
// its loader (concurrent reloads end with one registered run), and evicts idle runs that
// hold nothing, by their TTLs, without a Core.
func TestRunRegistry(t *testing.T) {
	clock := newTestClock()
	limits := &Limits{}
	limits.defaults()
	var loads atomic.Int32
	g := newRunRegistry(clock.Now, limits, func(_ context.Context, ws, id string) (*run, error) {
		loads.Add(1)
		if id != "run-stored" {
			return nil, nil
		}
		return bareRun(id, "", 0, "its session ended"), nil
	})
	ctx := context.Background()

	live := bareRun("run-live", "sess", 3, "")
	live.SetAdapter(true, false)
	g.add(live)
	for _, name := range []string{"run-live", "sess:train:3"} {
		r, err := g.get(ctx, "ws", name)
		require.NoError(t, err)
		require.Same(t, live, r, name)
	}
	require.Zero(t, loads.Load(), "a run in memory is not read from the store")

	r, err := g.get(ctx, "ws", "run-missing")
	require.NoError(t, err)
	require.Nil(t, r)

	var wg sync.WaitGroup
	got := make([]*run, 8)
	for i := range got {
		wg.Go(func() {
			r, err := g.get(ctx, "ws", "run-stored")
			require.NoError(t, err)
			got[i] = r
		})
	}
	wg.Wait()
	for _, r := range got {
		require.Same(t, got[0], r, "concurrent reloads register one run")
	}
	require.Equal(t, 2, g.len())

	// Idle eviction: the unloaded run goes after RunIdleTTL; the run holding an adapter never.
	require.Empty(t, g.evictIdle(clock.Now()))
	clock.add(limits.RunIdleTTL)
	gone := g.evictIdle(clock.Now())
	require.Equal(t, []*run{got[0]}, gone)
	clock.add(time.Hour)
	require.Empty(t, g.evictIdle(clock.Now()))
	require.Equal(t, 1, g.len())

	// A live run without an adapter goes after LiveRunIdleTTL, unless work is queued on it.
	live.SetAdapter(false, false)
	fb := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
	adm, err := live.Admit(1, fb)
	require.NoError(t, err)
	require.NoError(t, live.Commit(fb, "op", &task{Seq: adm.Seq}))
	require.Empty(t, g.evictIdle(clock.Now()))
	require.NotNil(t, live.TakeHead())
	require.Empty(t, g.evictIdle(clock.Now()), "a running task keeps the run")
	live.Release()
	require.Equal(t, []*run{live}, g.evictIdle(clock.Now()))
	r, err = g.get(ctx, "ws", "sess:train:3")
	require.NoError(t, err)
	require.Nil(t, r, "an evicted run's alias is gone with it")
}
