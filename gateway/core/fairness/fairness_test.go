package fairness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestTracker: per-workspace wait and inflation over the window, the SLO breach, Jain's
// index, and the window's expiry.
func TestTracker(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	reg := prometheus.NewRegistry()
	tr := New(reg, 3, c.now)
	for range 100 {
		tr.Observe(context.Background(), "light", "forward_backward", 10*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond) // 5×
		tr.Observe(context.Background(), "heavy", "forward_backward", 0, time.Second, time.Second)                                    // 1×
	}
	st := tr.Status("light")
	require.Equal(t, 100, st.Operations)
	require.Equal(t, 10*time.Millisecond, st.WaitP50)
	require.InDelta(t, 5, st.InflationP99, 1e-9)
	require.True(t, st.Breached, "5× is over the 3× target")
	require.False(t, tr.Status("heavy").Breached)
	// x = 1/5 and 1/1: (1.2)² / (2·(0.04+1)) ≈ 0.692
	require.InDelta(t, 1.44/2.08, tr.Jain(), 1e-9)

	out, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, out)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP loops_fairness_slo_breached 1 while a workspace's p99 latency inflation over the last 5 minutes is over the target.
# TYPE loops_fairness_slo_breached gauge
loops_fairness_slo_breached{workspace="heavy"} 0
loops_fairness_slo_breached{workspace="light"} 1
`), "loops_fairness_slo_breached"))

	c.t = c.t.Add(Window + time.Second)
	require.Zero(t, tr.Status("light").Operations, "the window moved past them")
	require.Equal(t, 1.0, tr.Jain())

	tr.Observe(context.Background(), "x", "sample", 0, time.Second, 0)
	require.InDelta(t, 1, tr.Status("x").InflationP99, 1e-9, "no service time: no inflation")
}
