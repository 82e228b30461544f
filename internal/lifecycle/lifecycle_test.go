package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/lifecycle"
)

// TestStopper: goroutines run with the Stopper's context, new ones are refused after
// Quiesce, Stop cancels and waits, and a stop that runs out of time names what is left.
func TestStopper(t *testing.T) {
	s := lifecycle.New(t.Context())
	started := make(chan struct{})
	require.NoError(t, s.Go("watcher", func(ctx context.Context) {
		close(started)
		<-ctx.Done()
	}))
	stuck := make(chan struct{})
	require.NoError(t, s.Go("stuck", func(context.Context) { <-stuck }))
	<-started
	require.Equal(t, map[string]int{"watcher": 1, "stuck": 1}, s.Running())

	s.Quiesce()
	require.ErrorIs(t, s.Go("late", func(context.Context) {}), lifecycle.ErrStopping)
	require.ErrorIs(t, s.Run("late", func(context.Context) {}), lifecycle.ErrStopping)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := s.Stop(ctx)
	var still *lifecycle.StillRunningError
	require.ErrorAs(t, err, &still)
	require.Equal(t, map[string]int{"stuck": 1}, still.Running, "the watcher ended with its context; the stuck one is named")
	require.ErrorContains(t, err, "stuck ×1")

	close(stuck)
	require.NoError(t, s.Stop(t.Context()))
	require.Empty(t, s.Running())
}
