package console

import (
	"bytes"
	"cmp"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
	"github.com/loops-dev/loops/internal/runhealth"
)

// EMAWeight is the weight of the past in the charts' smoothing: s_i = w·s_(i-1) + (1-w)·x_i,
// debiased over the first points as TensorBoard does.
const EMAWeight = 0.8

// chartOptions are a run page's toggles.
type chartOptions struct {
	// EMA draws the smoothed series over the raw one (drawn faint).
	EMA bool
	// Log draws the y axis on a log scale; values <= 0 cannot be drawn and are left out.
	Log bool
}

// chartView is one rendered chart.
type chartView struct {
	ID    string
	Title string
	// Points are the values drawn (all series), for tests and the page's counters.
	Points int
	// SVG is the chart, drawn on the server.
	SVG template.HTML
	// Note says what was left out or why nothing is drawn.
	Note string
	// Legend names the lines (drawn in the caption, not over the data).
	Legend []legendItem
}

// legendItem is one line's name and colour ("#rrggbb").
type legendItem struct {
	Name   string
	Color  string
	Dashed bool
}

func hexColor(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// series is one line of a chart.
type series struct {
	name string
	xy   plotter.XYs
	rgb  color.RGBA
}

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	orange = color.RGBA{R: 0xe6, G: 0x7e, B: 0x22, A: 0xff}
	red    = color.RGBA{R: 0xc0, G: 0x39, B: 0x2b, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	purple = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	// palette colours series in order.
	palette = []color.RGBA{blue, orange, green, purple}
)

// charts draws the run page's charts from a run's (downsampled) step metrics.
func charts(steps []*loopsv1.StepMetrics, o chartOptions) []chartView {
	var klK1, klK3, zero, gradNorm, updNorm, cost plotter.XYs
	var spent money.USD // the run's cost so far, exactly; drawn as a float
	tokens, backend := perStep{}, perStep{}
	// One loss series per loss function (an RL loop's cross_entropy and ppo differ in
	// scale), in order of first appearance.
	var lossFns []string
	loss := map[string]plotter.XYs{}
	for _, m := range steps {
		x := float64(m.GetStep())
		span := float64(max(m.GetLastStep()-m.GetStep()+1, 1))
		backend.add(m.GetStep(), m.GetBackendSeconds()/span)
		if m.GetKind() == loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP {
			if m.GradNorm != nil {
				gradNorm = append(gradNorm, plotter.XY{X: x, Y: m.GetGradNorm()})
			}
			if m.UpdateNorm != nil {
				updNorm = append(updNorm, plotter.XY{X: x, Y: m.GetUpdateNorm()})
			}
		}
		if m.GetKind() != loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD {
			continue
		}
		tokens.add(m.GetStep(), float64(m.GetTokens())/span)
		if c, err := money.ParseUSD(m.GetCostUsd(), money.Digits); err == nil && m.GetCostUsd() != "" {
			if sum, err := money.Add(spent, c); err == nil {
				spent = sum
				cost = append(cost, plotter.XY{X: float64(m.GetLastStep()), Y: float64(spent) / 1e12})
			}
		}
		if m.GetLossTokens() > 0 {
			fn := m.GetLossFn()
			if fn == "" {
				fn = "mixed" // merged records of different losses
			}
			if _, ok := loss[fn]; !ok {
				lossFns = append(lossFns, fn)
			}
			loss[fn] = append(loss[fn], plotter.XY{X: x, Y: m.GetLossMean()})
		}
		if rl := m.GetRl(); rl != nil {
			klK1 = append(klK1, plotter.XY{X: x, Y: rl.GetKlSampleTrainK1()})
			klK3 = append(klK3, plotter.XY{X: x, Y: rl.GetKlSampleTrainK3()})
			zero = append(zero, plotter.XY{X: x, Y: rl.GetZeroAdvantageFraction()})
		}
	}
	kl := threshold(runhealth.KLSampleTrainMax)
	zeroLine := threshold(runhealth.ZeroAdvantageMin)
	lossSeries := make([]series, 0, len(lossFns))
	for i, fn := range lossFns {
		lossSeries = append(lossSeries, series{fn, loss[fn], palette[i%len(palette)]})
	}
	if len(lossSeries) == 0 {
		lossSeries = append(lossSeries, series{"loss", nil, blue})
	}
	out := []chartView{drawChart("loss", "Loss per token (forward_backward)", o, nil, lossSeries...)}
	if len(cost) > 0 { // priced by the server's price sheet: the run's cost beside its loss
		out = append(out, drawChart("cost", "Cost so far, USD ("+spent.String()+" in all)", o, nil, series{"USD", cost, green}))
	}
	return append(out,
		drawChart("tokens", "Tokens per step", o, nil, series{"tokens", tokens.xys(), blue}),
		drawChart("step_time", "Backend seconds per step", o, nil, series{"seconds", backend.xys(), blue}),
		drawChart("kl", "kl_sample_train (RL)", o, &kl, series{"k3", klK3, blue}, series{"k1", klK1, orange}),
		drawChart("zero_adv", "Zero-advantage share (RL)", o, &zeroLine, series{"share", zero, blue}),
		drawChart("norms", "Gradient and update norms (optim_step)", o, nil, series{"gradient", gradNorm, blue}, series{"update", updNorm, orange}),
	)
}

// threshold is an alert's bound, drawn as a dashed red line.
type threshold float64

// perStep sums values per optimizer step, in step order.
type perStep struct {
	steps []int64
	sums  map[int64]float64
}

func (p *perStep) add(step int64, v float64) {
	if p.sums == nil {
		p.sums = map[int64]float64{}
	}
	if _, ok := p.sums[step]; !ok {
		p.steps = append(p.steps, step)
	}
	p.sums[step] += v
}

func (p *perStep) xys() plotter.XYs {
	out := make(plotter.XYs, 0, len(p.steps))
	for _, s := range p.steps {
		out = append(out, plotter.XY{X: float64(s), Y: p.sums[s]})
	}
	return out
}

// ema smooths ys (see EMAWeight).
func ema(xy plotter.XYs) plotter.XYs {
	out := make(plotter.XYs, len(xy))
	s := 0.0
	for i, p := range xy {
		s = EMAWeight*s + (1-EMAWeight)*p.Y
		out[i] = plotter.XY{X: p.X, Y: s / (1 - math.Pow(EMAWeight, float64(i+1)))}
	}
	return out
}

// drawable keeps the points a chart can draw: finite values, and positive ones on a log
// scale. It reports how many it left out.
func drawable(xy plotter.XYs, log bool) (plotter.XYs, int) {
	out := make(plotter.XYs, 0, len(xy))
	for _, p := range xy {
		if math.IsNaN(p.Y) || math.IsInf(p.Y, 0) || math.IsNaN(p.X) || (log && p.Y <= 0) {
			continue
		}
		out = append(out, p)
	}
	return out, len(xy) - len(out)
}

// drawChart draws the series on one chart as SVG; a chart with nothing to draw gets a note
// instead.
func drawChart(id, title string, o chartOptions, limit *threshold, ss ...series) chartView {
	v := chartView{ID: id, Title: title}
	p := plot.New()
	p.X.Label.Text = "step"
	left := 0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		xy, dropped := drawable(s.xy, o.Log)
		left += dropped
		v.Points += len(xy)
		if len(xy) == 0 {
			continue
		}
		for _, q := range xy {
			lo, hi = min(lo, q.X), max(hi, q.X)
		}
		main := xy
		if o.EMA {
			raw, err := plotter.NewLine(xy)
			if err != nil {
				continue
			}
			raw.Color = color.RGBA{R: s.rgb.R, G: s.rgb.G, B: s.rgb.B, A: 0x50}
			p.Add(raw)
			main = ema(xy)
		}
		line, err := plotter.NewLine(main)
		if err != nil {
			continue
		}
		line.Color = s.rgb
		line.Width = vg.Points(1.5)
		p.Add(line)
		if len(ss) > 1 {
			v.Legend = append(v.Legend, legendItem{Name: s.name, Color: hexColor(s.rgb)})
		}
		if len(xy) < 30 {
			pts, err := plotter.NewScatter(main)
			if err == nil {
				pts.GlyphStyle.Color = s.rgb
				pts.GlyphStyle.Radius = vg.Points(2)
				pts.GlyphStyle.Shape = draw.CircleGlyph{}
				p.Add(pts)
			}
		}
	}
	if left > 0 {
		what := "NaN or infinite"
		if o.Log {
			what = "non-positive, NaN or infinite"
		}
		v.Note = fmt.Sprintf("%d %s values not drawn", left, what)
	}
	if v.Points == 0 {
		if v.Note == "" {
			v.Note = "no data yet"
		}
		return v
	}
	if limit != nil && !(o.Log && *limit <= 0) {
		if lo == hi {
			lo, hi = lo-0.5, hi+0.5
		}
		t, err := plotter.NewLine(plotter.XYs{{X: lo, Y: float64(*limit)}, {X: hi, Y: float64(*limit)}})
		if err == nil {
			t.Color = red
			t.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(t)
			v.Legend = append(v.Legend, legendItem{Name: fmt.Sprintf("alert at %g", float64(*limit)), Color: hexColor(red), Dashed: true})
		}
	}
	p.X.Tick.Marker = stepTicks{}
	if !o.Log && flat(p.Y.Min, p.Y.Max) {
		p.Y.Min, p.Y.Max = p.Y.Min-1, p.Y.Max+1 // as gonum pads an exactly flat range
	}
	if !o.Log && p.Y.Min >= 0 {
		// Tokens, seconds, shares and most losses are counts from zero: start the axis there
		// (gonum pads a flat series by ±1, which would show negative seconds).
		p.Y.Min = 0
		if p.Y.Max <= 0 {
			p.Y.Max = 1
		}
		p.Y.Max *= 1.05 // headroom: the largest value is not drawn on the frame
	}
	if o.Log {
		p.Y.Scale = plot.LogScale{}
		// A flat series gets a decade around it; ticks at powers of ten only when the
		// range spans one (else the default ticks, which a log axis places fine).
		if flat(p.Y.Min, p.Y.Max) {
			p.Y.Min, p.Y.Max = p.Y.Min/math.Sqrt(10), p.Y.Max*math.Sqrt(10)
		}
		if p.Y.Max/p.Y.Min >= 10 {
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		}
	}
	p.Add(plotter.NewGrid())
	c := vgsvg.New(6.4*vg.Inch, 2.4*vg.Inch)
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		v.Note = "drawing failed: " + err.Error()
		return v
	}
	svg := buf.String()
	if i := strings.Index(svg, "<svg"); i > 0 {
		svg = svg[i:] // inline: no XML prolog
	}
	v.SVG = template.HTML(svg) // drawn here from numbers and our own labels
	return v
}

// stepTicks are the default ticks at whole steps only (a run's first steps would get
// ticks at 0.5 and 1.5).
type stepTicks struct{}

// Ticks implements plot.Ticker.
func (stepTicks) Ticks(lo, hi float64) []plot.Tick {
	all := plot.DefaultTicks{}.Ticks(lo, hi)
	out := make([]plot.Tick, 0, len(all))
	for _, t := range all {
		if t.Value == math.Trunc(t.Value) {
			if t.Label != "" {
				t.Label = strconv.FormatFloat(t.Value, 'f', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}

// flat reports whether a range is a single value up to rounding (the EMA of a constant
// series differs from it in the last bits), which an axis cannot span.
func flat(lo, hi float64) bool { return hi-lo <= 1e-9*max(math.Abs(lo), math.Abs(hi)) }

// evalChart draws each eval's score by the step of the checkpoint it scored (succeeded
// results only), one line per eval in order of first appearance by step.
func evalChart(results []*loopsv1.EvalResult, o chartOptions) chartView {
	sorted := append([]*loopsv1.EvalResult(nil), results...)
	slices.SortStableFunc(sorted, func(a, b *loopsv1.EvalResult) int { return cmp.Compare(a.GetStep(), b.GetStep()) })
	var names []string
	pts := map[string]plotter.XYs{}
	for _, r := range sorted {
		if r.GetState() != loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED {
			continue
		}
		n := r.GetEvalName()
		if _, ok := pts[n]; !ok {
			names = append(names, n)
		}
		pts[n] = append(pts[n], plotter.XY{X: float64(r.GetStep()), Y: r.GetScore()})
	}
	ss := make([]series, 0, len(names))
	for i, n := range names {
		ss = append(ss, series{n, pts[n], palette[i%len(palette)]})
	}
	if len(ss) == 0 {
		ss = append(ss, series{"score", nil, blue})
	}
	return drawChart("evals", "Eval scores by checkpoint step", o, nil, ss...)
}
