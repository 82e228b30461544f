package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/deploy"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/promtooltest"
)

// TestAlertRules: promtool accepts the rules (check rules, its linter's findings fatal)
// and their unit tests pass (test rules: each main alert fires on the series that should
// fire it, at the time it should, with its labels and annotations, and not before).
func TestAlertRules(t *testing.T) {
	bin := promtooltest.Binary(t)
	for _, args := range [][]string{
		{"check", "rules", "--lint=all", "--lint-fatal", "prometheus/alerts.yaml"},
		{"test", "rules", "prometheus/alerts_test.yaml"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestMetricsAreExported: every metric that a dashboard panel, a dashboard variable or an
// alert rule reads is exported by a running gateway once it has served a train step, a
// sample, and a streamed sample of a deployment; and every label they select or group by
// is one of that metric's labels (or one Prometheus adds when it scrapes). The PromQL is
// parsed by Prometheus's own parser.
func TestMetricsAreExported(t *testing.T) {
	queries := dashboardQueries(t)
	queries = append(queries, ruleQueries(t)...)
	require.Greater(t, len(queries), 30)
	used := map[string]map[string]bool{} // metric -> labels the query uses
	p := parser.NewParser(parser.Options{})
	for _, q := range queries {
		expr, err := p.ParseExpr(q.expr)
		require.NoError(t, err, "%s: %s", q.where, q.expr)
		for name, ls := range metricsOf(expr) {
			if used[name] == nil {
				used[name] = map[string]bool{}
			}
			for l := range ls {
				used[name][l] = true
			}
		}
	}

	exported, fams := scrape(t, serveTraffic(t))
	var missing []string
	for name, ls := range used {
		have, ok := exported[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		for l := range ls {
			if !have[l] && !scrapeLabels[l] {
				missing = append(missing, name+" label "+l)
			}
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "used by deploy/grafana or deploy/prometheus but not exported by the gateway")
	// What the traffic shows in the sampling metrics: one streamed sample of a deployment
	// (its time to first token), two samples on the backend each alone (batch size 1),
	// none running now, and the deployment's prompt and output tokens.
	ttft := fams["loops_sample_time_to_first_token_seconds"].GetMetric()
	require.Len(t, ttft, 1)
	require.Equal(t, "deployment", ttft[0].GetLabel()[0].GetValue())
	require.EqualValues(t, 1, ttft[0].GetHistogram().GetSampleCount())
	require.Positive(t, ttft[0].GetHistogram().GetSampleSum())
	batch := fams["loops_sample_batch_size"].GetMetric()[0].GetHistogram()
	require.EqualValues(t, 2, batch.GetSampleCount())
	require.EqualValues(t, 2, batch.GetSampleSum())
	require.Zero(t, fams["loops_samples_running"].GetMetric()[0].GetGauge().GetValue())
	dtok := map[string]float64{}
	for _, m := range fams["loops_deployment_tokens_total"].GetMetric() {
		dtok[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	require.Positive(t, dtok["prompt"])
	require.InDelta(t, 2.5, dtok["output"], 1.5, "1 to 4 tokens (max_tokens 4)")

	// The new operational metrics are among those used.
	for _, name := range []string{"loops_backend_workers", "loops_store_up", "loops_checkpoint_store_available_bytes",
		"loops_sample_time_to_first_token_seconds_bucket", "loops_deployment_tokens_total", "loops_sample_batch_size_bucket",
		"loops_latency_inflation_bucket", "loops_queue_wait_seconds_bucket", "loops_fairness_slo_breached"} {
		require.Contains(t, used, name)
	}
}

// scrapeLabels are the labels Prometheus adds to every series it scrapes.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// query is one PromQL expression and where it is.
type query struct{ where, expr string }

// grafanaVar matches a Grafana variable in a query ($name, ${name}, ${name:format}).
var grafanaVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|\$([A-Za-z0-9_]+)`)

// labelValues is Grafana's variable query label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// promql turns a Grafana query into PromQL: its interval variables ($__rate_interval, ...)
// become a duration and other variables a label value.
func promql(q string) string {
	return grafanaVar.ReplaceAllStringFunc(q, func(v string) string {
		if strings.Contains(v, "__") {
			return "5m"
		}
		return "x"
	})
}

// dashboardQueries returns the expressions of every dashboard's panels (rows' panels too)
// and query variables.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	files, err := fs.Glob(deploy.Files, "grafana/*.json")
	require.NoError(t, err)
	require.Len(t, files, 2)
	var out []query
	for _, f := range files {
		b, err := fs.ReadFile(deploy.Files, f)
		require.NoError(t, err)
		var d struct {
			UID        string  `json:"uid"`
			Title      string  `json:"title"`
			Panels     []panel `json:"panels"`
			Templating struct {
				List []struct {
					Name  string          `json:"name"`
					Type  string          `json:"type"`
					Query json.RawMessage `json:"query"`
				} `json:"list"`
			} `json:"templating"`
		}
		require.NoError(t, json.Unmarshal(b, &d), f)
		require.NotEmpty(t, d.UID, f)
		require.NotEmpty(t, d.Title, f)
		var walk func([]panel)
		n := 0
		walk = func(ps []panel) {
			for _, p := range ps {
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				require.NotEmpty(t, p.Targets, "%s: panel %q has no query", f, p.Title)
				for _, tg := range p.Targets {
					out = append(out, query{f + ": " + p.Title, promql(tg.Expr)})
					n++
				}
			}
		}
		walk(d.Panels)
		require.Greater(t, n, 5, f)
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			var q struct {
				Query string `json:"query"`
			}
			if json.Unmarshal(v.Query, &q) != nil { // the older form: the query as a string
				require.NoError(t, json.Unmarshal(v.Query, &q.Query), "%s: variable %s", f, v.Name)
			}
			m := labelValues.FindStringSubmatch(q.Query)
			require.NotNil(t, m, "%s: variable %s: only label_values(SELECTOR, LABEL) is checked: %s", f, v.Name, q.Query)
			out = append(out, query{f + ": variable " + v.Name, promql("count by (" + m[2] + ") (" + m[1] + ")")})
		}
	}
	return out
}

// panel is the part of a Grafana panel the test reads.
type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// ruleQueries returns the expressions of the alert rules (promtool validates the file as
// Prometheus reads it: TestAlertRules).
func ruleQueries(t *testing.T) []query {
	t.Helper()
	b, err := fs.ReadFile(deploy.Files, "prometheus/alerts.yaml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &rules))
	var out []query
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "only alerting rules")
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			require.NotEmpty(t, r.Annotations["description"], r.Alert)
			out = append(out, query{"alert " + r.Alert, r.Expr})
		}
	}
	require.Greater(t, len(out), 5)
	return out
}

// metricsOf returns the metrics an expression reads, each with the labels it selects on
// and the labels the aggregations above it group by.
func metricsOf(expr parser.Expr) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	var visit func(n parser.Node, grouping []string)
	visit = func(n parser.Node, grouping []string) {
		switch n := n.(type) {
		case *parser.VectorSelector:
			ls := map[string]bool{}
			for _, m := range n.LabelMatchers {
				if m.Name != labels.MetricName {
					ls[m.Name] = true
				}
			}
			for _, g := range grouping {
				ls[g] = true
			}
			if out[n.Name] == nil {
				out[n.Name] = map[string]bool{}
			}
			for l := range ls {
				out[n.Name][l] = true
			}
			return
		case *parser.AggregateExpr:
			if !n.Without {
				grouping = append(slices.Clone(grouping), n.Grouping...)
			}
		case *parser.Call:
			// histogram_quantile's input groups by le; label_replace-like calls are unused
		}
		for _, c := range parser.Children(n) {
			visit(c, grouping)
		}
	}
	visit(expr, nil)
	return out
}

const key = "tml-dashboards-key"

// serveTraffic starts a gateway (the embedded engine, a local checkpoint folder) and sends
// it a train step, a sample, a deployment and a streamed completion of it; it returns the
// gateway's URL.
func serveTraffic(t *testing.T) string {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{key + "=team-a"})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	url := "http://" + ln.Addr().String()
	ctx := t.Context()
	hc := http.DefaultClient
	withKey := connectKey(key)
	training := loopsv1connect.NewTrainingServiceClient(hc, url, withKey)
	ops := loopsv1connect.NewOperationServiceClient(hc, url, withKey)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)})
			require.NoError(t, err)
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
	run := wait(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 2, Seed: 1, TrainAttn: true},
	})).GetTrainingRun().GetId()
	in := []int32{72, 101, 108, 108, 111, 33, 32, 72}
	tgt := []int64{101, 108, 108, 111, 33, 32, 72, 105}
	w := []float32{1, 1, 1, 1, 1, 1, 1, 1}
	wait(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}}))
	wait(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 0.01}}))
	saved := wait(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "c1",
		Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})).GetSaveWeights()
	sampling := loopsv1connect.NewSamplingServiceClient(hc, url, withKey)
	wait(sampling.Sample(ctx, &loopsv1.SampleRequest{ModelPath: saved.GetPath(), Prompt: in[:4],
		Params: &loopsv1.SamplingParams{MaxTokens: 3, Temperature: 1, TopP: 1}}))
	_, err = loopsv1connect.NewDeploymentServiceClient(hc, url, withKey).CreateDeployment(ctx,
		&loopsv1.CreateDeploymentRequest{Name: "dep", Checkpoints: []string{saved.GetPath()}})
	require.NoError(t, err)

	// A streamed completion of the deployment (its time to first token).
	raw, err := json.Marshal(map[string]any{"model": "dep/c1", "prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": true})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/oai/api/v1/completions", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	events := 0
	for sc := bufio.NewScanner(res.Body); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	require.Greater(t, events, 1, "a streamed answer")
	return url
}

// connectKey sends the API key on every loops.v1 call.
func connectKey(k string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", k)
			return next(ctx, req)
		}
	}))
}

// scrape reads the gateway's /metrics and returns each metric name PromQL can select
// (a histogram's _bucket, _sum and _count) with the labels of its series.
func scrape(t *testing.T, url string) (map[string]map[string]bool, map[string]*dto.MetricFamily) {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	add := func(name string, ls map[string]bool) {
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for l := range ls {
			out[name][l] = true
		}
	}
	for name, f := range fams {
		ls := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = true
			}
		}
		switch f.GetType().String() {
		case "HISTOGRAM":
			add(name+"_bucket", map[string]bool{"le": true})
			add(name+"_bucket", ls)
			add(name+"_sum", ls)
			add(name+"_count", ls)
		case "SUMMARY":
			add(name, map[string]bool{"quantile": true})
			add(name, ls)
			add(name+"_sum", ls)
			add(name+"_count", ls)
		default:
			add(name, ls)
		}
	}
	return out, fams
}
