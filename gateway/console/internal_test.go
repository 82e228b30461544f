package console

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot/plotter"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestSessionsBounded(t *testing.T) {
	clk := &clock{t: time.Unix(1_000_000, 0)}
	s := newSessions(Options{MaxSessions: 4, MaxSessionsPerWorkspace: 2, SessionIdle: time.Hour, SessionLifetime: 3 * time.Hour, Now: clk.now}.withDefaults())

	a1, err := s.create("tml-a", "a")
	require.NoError(t, err)
	clk.t = clk.t.Add(time.Minute)
	a2, err := s.create("tml-a", "a")
	require.NoError(t, err)
	require.NotEqual(t, a1.id, a2.id)
	require.NotEqual(t, a1.csrf, a2.csrf)
	clk.t = clk.t.Add(time.Minute)
	require.NotNil(t, s.get(a1.id)) // a1 is now the most recently used
	// A third sign-in of workspace a ends a's least recently used session (a2), no other's.
	a3, err := s.create("tml-a", "a")
	require.NoError(t, err)
	require.Nil(t, s.get(a2.id))
	require.NotNil(t, s.get(a1.id))
	require.NotNil(t, s.get(a3.id))
	clk.t = clk.t.Add(time.Minute)
	require.NotNil(t, s.get(a3.id)) // a3 is now a's most recently used

	clk.t = clk.t.Add(time.Minute)
	b1, err := s.create("tml-b", "b")
	require.NoError(t, err)
	clk.t = clk.t.Add(time.Minute)
	_, err = s.create("tml-b", "b")
	require.NoError(t, err)
	require.Equal(t, 4, s.len()) // full
	// A new workspace gets in on a full server at the cost of the largest workspace's least
	// recently used session (a and b hold 2 each: a by name, and a1 is a's older one).
	clk.t = clk.t.Add(time.Minute)
	c1, err := s.create("tml-c", "c")
	require.NoError(t, err)
	require.Nil(t, s.get(a1.id))
	require.NotNil(t, s.get(a3.id))
	require.NotNil(t, s.get(c1.id))
	// Now no workspace holds two more than c: c's second sign-in is refused, no one pushed out.
	clk.t = clk.t.Add(time.Minute)
	_, err = s.create("tml-c", "c")
	require.ErrorIs(t, err, errSessionsFull)
	require.Equal(t, 4, s.len())

	// Idle expiry: b1 unused for over an hour is gone, and its slot is free again.
	clk.t = clk.t.Add(61 * time.Minute)
	require.Nil(t, s.get(b1.id))
	_, err = s.create("tml-c", "c")
	require.NoError(t, err)
	require.LessOrEqual(t, s.len(), 4)

	// Lifetime: even a session in use ends SessionLifetime after sign-in.
	x, err := s.create("tml-d", "d")
	require.NoError(t, err)
	for range 5 {
		clk.t = clk.t.Add(50 * time.Minute)
		if s.get(x.id) == nil {
			break
		}
	}
	require.Nil(t, s.get(x.id))
	require.Less(t, clk.t.Sub(x.created), 3*time.Hour+time.Hour)

	// A signed-out session is gone; an unknown or empty id is no session.
	s.remove(a1.id)
	require.Nil(t, s.get(a1.id))
	require.Nil(t, s.get(""))
	require.Nil(t, s.get("nope"))
	require.True(t, a3.validCSRF(a3.csrf))
	require.False(t, a3.validCSRF(""))
	require.False(t, a3.validCSRF(a1.csrf))
}

func TestEMA(t *testing.T) {
	xy := plotter.XYs{{X: 1, Y: 10}, {X: 2, Y: 0}, {X: 3, Y: 5}}
	got := ema(xy)
	// Independent computation: debiased EMA with weight w on the past.
	w := EMAWeight
	s1 := (1 - w) * 10
	s2 := w*s1 + (1-w)*0
	s3 := w*s2 + (1-w)*5
	want := []float64{s1 / (1 - w), s2 / (1 - w*w), s3 / (1 - w*w*w)}
	for i := range want {
		require.InDelta(t, want[i], got[i].Y, 1e-12)
		require.Equal(t, xy[i].X, got[i].X)
	}
	require.InDelta(t, 10, got[0].Y, 1e-12) // the first point is itself
}

func fbRecord(step int64, fn string, loss float64, tokens int64) *loopsv1.StepMetrics {
	return &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Step: step, LastStep: step, LossFn: fn,
		LossMean: loss, LossSum: loss * float64(tokens), LossTokens: tokens, Tokens: tokens, BackendSeconds: 0.5}
}

func chartByID(t *testing.T, cs []chartView, id string) chartView {
	t.Helper()
	for _, c := range cs {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("no chart %q", id)
	return chartView{}
}

func TestCharts(t *testing.T) {
	// No records: every chart says so and draws nothing.
	for _, c := range charts(nil, chartOptions{}) {
		require.Zero(t, c.Points)
		require.Empty(t, c.SVG)
		require.Equal(t, "no data yet", c.Note)
	}

	steps := []*loopsv1.StepMetrics{
		fbRecord(1, "cross_entropy", 2, 10), fbRecord(1, "ppo", -0.5, 6),
		{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, Step: 1, LastStep: 1, BackendSeconds: 0.25, LearningRate: proto.Float64(1e-3),
			GradNorm: proto.Float64(3), UpdateNorm: proto.Float64(0.01)},
		fbRecord(2, "cross_entropy", math.NaN(), 10),
		// A merged record over steps 3-4: its tokens and time count per step.
		{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Step: 3, LastStep: 4, Count: 2, LossFn: "cross_entropy", LossMean: 1, LossTokens: 20, Tokens: 40, BackendSeconds: 2},
	}
	steps[1].Rl = &loopsv1.RLStepMetrics{KlSampleTrainK1: 0.02, KlSampleTrainK3: 0.01, ZeroAdvantageFraction: 0.5}
	cs := charts(steps, chartOptions{})
	loss := chartByID(t, cs, "loss")
	require.Equal(t, 3, loss.Points) // cross_entropy 2 and 1, ppo -0.5; the NaN left out
	require.Equal(t, "1 NaN or infinite values not drawn", loss.Note)
	require.Contains(t, string(loss.SVG), "<svg")
	require.Equal(t, []legendItem{{Name: "cross_entropy", Color: "#1f77b4"}, {Name: "ppo", Color: "#e67e22"}}, loss.Legend) // a line per loss function
	require.NotContains(t, string(loss.SVG), "<?xml")
	tokens := chartByID(t, cs, "tokens")
	require.Equal(t, 3, tokens.Points) // steps 1, 2, 3 (the merged record's step)
	kl := chartByID(t, cs, "kl")
	require.Equal(t, 2, kl.Points)
	require.Contains(t, kl.Legend, legendItem{Name: "alert at 0.01", Color: "#c0392b", Dashed: true})
	require.Equal(t, 1, chartByID(t, cs, "zero_adv").Points)
	norms := chartByID(t, cs, "norms")
	require.Equal(t, 2, norms.Points) // the one optim_step's gradient and update norms
	require.Equal(t, []legendItem{{Name: "gradient", Color: "#1f77b4"}, {Name: "update", Color: "#e67e22"}}, norms.Legend)

	// Log scale: non-positive values cannot be drawn and are counted as left out.
	cs = charts(steps, chartOptions{Log: true, EMA: true})
	loss = chartByID(t, cs, "loss")
	require.Equal(t, 2, loss.Points)
	require.Equal(t, "2 non-positive, NaN or infinite values not drawn", loss.Note)
	require.Contains(t, string(loss.SVG), "<svg")
	// A flat series on a log scale still gets an axis around it.
	tokens = chartByID(t, cs, "tokens")
	require.Equal(t, 3, tokens.Points)
	require.Contains(t, string(tokens.SVG), "<svg")
}

// TestFlatSeriesDrawn: a constant series (exactly, or smoothed to within rounding) is drawn
// inside the plot on every scale: its line's y is strictly between the axis ends.
func TestFlatSeriesDrawn(t *testing.T) {
	flatXY := plotter.XYs{{X: 1, Y: 108}, {X: 2, Y: 108}, {X: 3, Y: 108}, {X: 4, Y: 108}, {X: 5, Y: 108}}
	line := regexp.MustCompile(`<path d="M([\d.]+),([\d.]+)L[^"]*" style="fill:none;stroke:#1F77B4;stroke-width:1.5"`)
	for _, o := range []chartOptions{{}, {Log: true}, {EMA: true}, {EMA: true, Log: true}} {
		v := drawChart("x", "x", o, nil, series{"a", flatXY, blue})
		m := line.FindStringSubmatch(string(v.SVG))
		require.NotNil(t, m, "%+v: no line drawn", o)
		y, err := strconv.ParseFloat(m[2], 64)
		require.NoError(t, err)
		require.Greater(t, y, 40.0, "%+v", o) // above the x axis
		require.Less(t, y, 170.0, "%+v", o)   // below the top
	}
	require.True(t, flat(108, 108+1e-12))
	require.False(t, flat(0.001, 0.002))
}

func TestPerStep(t *testing.T) {
	var p perStep
	p.add(2, 1)
	p.add(1, 3)
	p.add(2, 4)
	require.Equal(t, plotter.XYs{{X: 2, Y: 5}, {X: 1, Y: 3}}, p.xys())
}

func TestStepTicks(t *testing.T) {
	for _, tk := range (stepTicks{}).Ticks(0.5, 1.5) {
		require.Equal(t, math.Trunc(tk.Value), tk.Value)
		if tk.Label != "" {
			require.Equal(t, "1", tk.Label)
		}
	}
	labels := []string{}
	for _, tk := range (stepTicks{}).Ticks(0, 100) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	require.Equal(t, []string{"0", "50", "100"}, labels) // gonum's default ticks, whole already
}

// BenchmarkCharts draws a run page's charts from ChartPoints records of each kind (the most
// a page asks for), with and without the toggles: the cost of one live refresh's drawing.
func BenchmarkCharts(b *testing.B) {
	var steps []*loopsv1.StepMetrics
	for i := range int64(ChartPoints) {
		fb := fbRecord(i+1, "ppo", 1/float64(i+1), 512)
		fb.Rl = &loopsv1.RLStepMetrics{KlSampleTrainK1: 0.001, KlSampleTrainK3: 0.0005, ZeroAdvantageFraction: 0.25}
		steps = append(steps, fb, &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, Step: i + 1, LastStep: i + 1, BackendSeconds: 0.1})
	}
	for _, o := range []chartOptions{{}, {EMA: true, Log: true}} {
		b.Run(fmt.Sprintf("ema=%v,log=%v", o.EMA, o.Log), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cs := charts(steps, o)
				if len(cs) != 6 || cs[0].Points != ChartPoints {
					b.Fatal("unexpected charts")
				}
			}
		})
	}
}

func TestDrawerCachesAndBounds(t *testing.T) {
	d := newDrawer(1)
	steps := []*loopsv1.StepMetrics{fbRecord(1, "cross_entropy", 2, 10)}
	k := keyOf("ws", "run", steps, chartOptions{})
	a, err := d.draw(t.Context(), k, steps)
	require.NoError(t, err)
	b, err := d.draw(t.Context(), k, steps)
	require.NoError(t, err)
	require.Same(t, &a[0], &b[0]) // the second refresh did not draw again

	// A new step, another workspace or other toggles is another drawing.
	steps2 := append(steps, &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, SeqId: 2, LastSeqId: 2, Step: 1})
	require.NotEqual(t, k, keyOf("ws", "run", steps2, chartOptions{}))
	require.NotEqual(t, k, keyOf("other", "run", steps, chartOptions{}))
	require.NotEqual(t, k, keyOf("ws", "run", steps, chartOptions{Log: true}))

	// The cache is bounded.
	for i := range chartCacheSize + 10 {
		_, err := d.draw(t.Context(), keyOf("ws", fmt.Sprint("run", i), steps, chartOptions{}), steps)
		require.NoError(t, err)
	}
	require.Len(t, d.cache, chartCacheSize)
	require.Len(t, d.order, chartCacheSize)

	// With every slot taken, a drawing waits for one until its deadline, then is refused.
	d.slots <- struct{}{}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = d.draw(ctx, keyOf("ws", "new", steps, chartOptions{}), steps)
	require.ErrorIs(t, err, errDrawBusy)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	<-d.slots
}

// TestEvalChart: one line per eval, by step, succeeded results only.
func TestEvalChart(t *testing.T) {
	ok := loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED
	c := evalChart([]*loopsv1.EvalResult{
		{EvalName: "mc", Step: 20, Score: 0.5, State: ok},
		{EvalName: "heldout", Step: 10, Score: 2.5, State: ok},
		{EvalName: "heldout", Step: 20, Score: 2.1, State: ok},
		{EvalName: "heldout", Step: 30, State: loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING},
		{EvalName: "mc", Step: 30, State: loopsv1.EvalResultState_EVAL_RESULT_STATE_FAILED, Error: "x"},
	}, chartOptions{})
	require.Equal(t, "evals", c.ID)
	require.Equal(t, 3, c.Points)
	require.Equal(t, []legendItem{{Name: "heldout", Color: "#1f77b4"}, {Name: "mc", Color: "#e67e22"}}, c.Legend)
	require.Contains(t, string(c.SVG), "<svg")
	require.Zero(t, evalChart(nil, chartOptions{}).Points)
}
