package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"
)

// fakeWorkspace answers GetWorkspace for one key with one allowed model.
type fakeWorkspace struct {
	loopsv1connect.UnimplementedWorkspaceServiceHandler
	key string
}

func (f *fakeWorkspace) GetWorkspace(ctx context.Context, _ *loopsv1.GetWorkspaceRequest) (*loopsv1.Workspace, error) {
	info, ok := connect.CallInfoForHandlerContext(ctx)
	if !ok || info.RequestHeader().Get("X-API-Key") != f.key {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("unknown API key"))
	}
	return &loopsv1.Workspace{Name: "team-a", Limits: &loopsv1.WorkspaceLimits{
		Models: []*loopsv1.ModelInfo{{Name: "loops/tiny", MaxSequenceLength: 128, MaxLoraRank: 16}},
	}}, nil
}

// fakeLoops serves /healthz and loops.v1 WorkspaceService on 127.0.0.1:0.
func fakeLoops(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	path, h := loopsv1connect.NewWorkspaceServiceHandler(&fakeWorkspace{key: "tml-good"})
	mux.Handle(path, h)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func checkResults(rows []checkRow) map[string]bool {
	out := map[string]bool{}
	for _, r := range rows {
		out[r.Check] = r.OK
	}
	return out
}

func TestCookbookServerChecks(t *testing.T) {
	url := fakeLoops(t)
	ctx := context.Background()

	rows, maxLen := serverChecks(ctx, url, "tml-good", recipeSettings{Model: "loops/tiny", LoraRank: 8})
	require.Equal(t, map[string]bool{"server reachable": true, "API key": true, "base model": true, "LoRA rank": true}, checkResults(rows))
	require.Equal(t, 128, maxLen)
	require.Contains(t, rows[2].Detail, "max sequence length 128")
	require.Contains(t, rows[1].Detail, "team-a")

	rows, maxLen = serverChecks(ctx, url, "tml-bad", recipeSettings{Model: "loops/tiny", LoraRank: 8})
	require.Equal(t, map[string]bool{"server reachable": true, "API key": false}, checkResults(rows))
	require.Contains(t, rows[1].Detail, "unauthenticated")
	require.Zero(t, maxLen)

	rows, _ = serverChecks(ctx, url, "", recipeSettings{Model: "loops/tiny", LoraRank: 8})
	require.Equal(t, map[string]bool{"server reachable": true, "API key": false}, checkResults(rows))
	require.Contains(t, rows[1].Detail, "TINKER_API_KEY")

	rows, _ = serverChecks(ctx, url, "tml-good", recipeSettings{Model: "Qwen/Qwen3-8B", LoraRank: 8})
	require.False(t, checkResults(rows)["base model"])
	require.Contains(t, rows[2].Detail, "allowed: loops/tiny")

	rows, _ = serverChecks(ctx, url, "tml-good", recipeSettings{Model: "loops/tiny", LoraRank: 32})
	require.False(t, checkResults(rows)["LoRA rank"])
	require.Contains(t, rows[3].Detail, "lora_rank=16 or less")

	// Nothing listens on a port just closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + l.Addr().String()
	l.Close()
	rows, _ = serverChecks(ctx, down, "tml-good", recipeSettings{Model: "loops/tiny"})
	require.Equal(t, map[string]bool{"server reachable": false}, checkResults(rows))
	require.Contains(t, rows[0].Detail, "loops serve")
}

func TestCookbookParseSettings(t *testing.T) {
	show := []byte(`{"name":"sft_chat","config":[{"name":"model","default":"loops/tiny"},{"name":"lora_rank","default":8},{"name":"steps","default":20}]}`)
	s, err := parseSettings(show, nil)
	require.NoError(t, err)
	require.Equal(t, recipeSettings{Model: "loops/tiny", LoraRank: 8}, s)

	s, err = parseSettings(show, []string{"model=Qwen/Qwen3-8B", "lora_rank=32", "steps=3"})
	require.NoError(t, err)
	require.Equal(t, recipeSettings{Model: "Qwen/Qwen3-8B", LoraRank: 32}, s)

	for _, bad := range []string{"lora_rank=x", "lora_rank=0", "novalue"} {
		_, err = parseSettings(show, []string{bad})
		var ee *exitError
		require.ErrorAs(t, err, &ee, bad)
		require.Equal(t, exitCookbookUsage, ee.ExitCode(), bad)
	}
	_, err = parseSettings([]byte(`{"config":[]}`), nil)
	require.ErrorContains(t, err, "names no model")
	_, err = parseSettings([]byte(`not json`), nil)
	require.Error(t, err)
}

func TestCookbookParseOutputs(t *testing.T) {
	rs, err := parseRecipeList([]byte(`[{"name":"a","summary":"x"},{"name":"b","summary":"y"}]` + "\n"))
	require.NoError(t, err)
	require.Equal(t, []recipeInfo{{"a", "x"}, {"b", "y"}}, rs)
	_, err = parseRecipeList([]byte(`[{"summary":"x"}]`))
	require.ErrorContains(t, err, "no name")
	_, err = parseRecipeList([]byte(`Traceback ...`))
	require.Error(t, err)

	rows, est, why, _, err := parseCheckOutput([]byte(`{"recipe":"a","checks":[{"check":"data","ok":true,"detail":"3 records"}]}`))
	require.NoError(t, err)
	require.Equal(t, []checkRow{{"data", true, "3 records"}}, rows)
	require.Nil(t, est)
	require.Empty(t, why)
	_, _, _, _, err = parseCheckOutput([]byte(`{"checks":[{"ok":true}]}`))
	require.ErrorContains(t, err, "no name")
	_, est, why, _, err = parseCheckOutput([]byte(`{"checks":[],"estimate_error":"needs a pilot"}`))
	require.NoError(t, err)
	require.Nil(t, est)
	require.Equal(t, "needs a pilot", why)
	_, est, _, _, err = parseCheckOutput([]byte(`{"checks":[],"estimate":{"base_model":"loops/tiny","steps":1,"batch_size":2,"example_tokens":[5,7]}}`))
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(&loopsv1.EstimateCostRequest{BaseModel: "loops/tiny", Steps: 1, BatchSize: 2, ExampleTokens: []int64{5, 7}}, est, protocmp.Transform()))
	_, est, _, _, err = parseCheckOutput([]byte(`{"checks":[],"estimate":{"base_model":"m","usage":[{"kind":"USAGE_KIND_TRAINING_TOKENS","amount":5,"amount_low":4,"amount_high":7}]}}`))
	require.NoError(t, err)
	require.Empty(t, cmp.Diff(&loopsv1.EstimateCostRequest{BaseModel: "m", Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 5, AmountLow: 4, AmountHigh: 7}}}, est, protocmp.Transform()))
	_, _, _, used, err := parseCheckOutput([]byte(`{"checks":[],"estimate_error":"x","pilot_sessions":["s1","s2"],"pilot_runs":["run-a"]}`))
	require.NoError(t, err)
	require.Equal(t, pilotUsage{Sessions: []string{"s1", "s2"}, Runs: []string{"run-a"}}, used)
	_, _, _, _, err = parseCheckOutput([]byte(`{"checks":[],"estimate":{"steps":"x"}}`))
	require.ErrorContains(t, err, "estimate")
	// a pilot's output names its log folder, which `run --resume` continues from
	require.Equal(t, "/tmp/p", resumeDir([]byte(`{"checks":[],"resume":"/tmp/p","estimate":{"base_model":"m"}}`)))
	require.Empty(t, resumeDir([]byte(`{"checks":[]}`)))
	require.Empty(t, resumeDir([]byte(`Traceback ...`)))

	buf0 := &bytes.Buffer{}
	printEstimate(buf0, &loopsv1.EstimateCostResponse{TotalUsd: "0.0000088", Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 12, CostUsd: "0.0000048"},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 3},
	}}, false)
	require.Equal(t, "KIND                    TOKENS  USD\ntraining_tokens         12      0.0000048\nsampling_sample_tokens  3       -\ntotal                           0.0000088\n", buf0.String())
	buf0.Reset()
	printEstimate(buf0, &loopsv1.EstimateCostResponse{TotalUsd: "0.0000048", TotalLowUsd: "0.000004", TotalHighUsd: "0.0000056", Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 12, CostUsd: "0.0000048", AmountLow: 10, AmountHigh: 14, CostLowUsd: "0.000004", CostHighUsd: "0.0000056"},
	}}, true)
	require.Equal(t, "KIND             TOKENS  USD        TOKENS LOW-HIGH  USD LOW-HIGH\ntraining_tokens  12      0.0000048  10-14            0.000004-0.0000056\n"+
		"total                    0.0000048                   0.000004-0.0000056\n", buf0.String())
	// exact tokens by kind (no pilot: low = amount = high on every line) print without a band
	buf0.Reset()
	printEstimate(buf0, &loopsv1.EstimateCostResponse{TotalUsd: "0.0000048", TotalLowUsd: "0.0000048", TotalHighUsd: "0.0000048", Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 12, CostUsd: "0.0000048", AmountLow: 12, AmountHigh: 12, CostLowUsd: "0.0000048", CostHighUsd: "0.0000048"},
	}}, false)
	require.Equal(t, "KIND             TOKENS  USD\ntraining_tokens  12      0.0000048\ntotal                    0.0000048\n", buf0.String())

	var buf bytes.Buffer
	printChecks(&buf, []checkRow{{"server reachable", true, "http://x"}, {"sandbox", false, "plain: network is reachable"}})
	require.Equal(t, "CHECK             RESULT  DETAIL\nserver reachable  PASS    http://x\nsandbox           FAIL    plain: network is reachable\n", buf.String())
}

func TestCookbookExtractIsIdempotent(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir, err := extractCookbook()
	require.NoError(t, err)
	src, err := os.ReadFile("../../cookbook/loops_cookbook/registry.py")
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, "loops_cookbook", "registry.py"))
	require.NoError(t, err)
	require.Equal(t, src, got)
	again, err := extractCookbook()
	require.NoError(t, err)
	require.Equal(t, dir, again)
	a, err := dirDigest(dir)
	require.NoError(t, err)
	b, err := dirDigest(dir)
	require.NoError(t, err)
	require.Equal(t, a, b)
}

// python311 returns a python3 of version 3.11 or later, or skips.
func python311(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	if exec.Command(py, "-c", "import sys; sys.exit(sys.version_info < (3, 11))").Run() != nil {
		t.Skip("python3 older than 3.11")
	}
	return py
}

// runLoops runs the loops command tree in-process and returns stdout and the exit code.
func runLoops(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := rootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = 1
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
	}
	return out.String(), code
}

// The Go command drives the real cookbook CLI (plain python3, no venv: list and show need no
// SDK, and check's local rows say what is missing).
func TestCookbookCommandDrivesThePythonCLI(t *testing.T) {
	py := python311(t)
	dir, err := filepath.Abs("../../cookbook")
	require.NoError(t, err)
	common := []string{"--python", py, "--cookbook-dir", dir}

	want, err := exec.Command(py, "-c", "import json; from loops_cookbook.registry import RECIPES; print(json.dumps(list(RECIPES)))").Output()
	if err != nil {
		// Run from the cookbook folder so the package is importable.
		c := exec.Command(py, "-c", "import json; from loops_cookbook.registry import RECIPES; print(json.dumps(list(RECIPES)))")
		c.Dir = dir
		want, err = c.Output()
	}
	require.NoError(t, err)
	var names []string
	require.NoError(t, json.Unmarshal(want, &names))
	require.Len(t, names, 7)

	out, code := runLoops(t, append([]string{"cookbook", "list"}, common...)...)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1+len(names))
	for i, n := range names {
		require.True(t, strings.HasPrefix(lines[i+1], n+" "), lines[i+1])
	}

	out, code = runLoops(t, append([]string{"cookbook", "show", "rl_async"}, common...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "max_staleness")
	require.Contains(t, out, "Data format:")

	_, code = runLoops(t, append([]string{"cookbook", "show", "no_such_recipe"}, common...)...)
	require.Equal(t, exitCookbookUsage, code)
	_, code = runLoops(t, append([]string{"cookbook", "run", "sft_chat", "no_such_field=1"}, common...)...)
	require.Equal(t, exitCookbookUsage, code)

	url := fakeLoops(t)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"prompt\": \"x\", \"answer\": \"1\"}\nnot json\n"), 0o644))
	out, code = runLoops(t, append([]string{"cookbook", "check", "rl_async", "data=" + bad, "--url", url, "--api-key", "tml-good"}, common...)...)
	require.Equal(t, exitCookbookFailed, code, out)
	require.Regexp(t, `server reachable\s+PASS`, out)
	require.Regexp(t, `base model\s+PASS\s+loops/tiny allowed, max sequence length 128`, out)
	require.Regexp(t, `data data\s+FAIL\s+.*bad.jsonl:2: not JSON`, out)

	_, code = runLoops(t, append([]string{"cookbook", "check", "rl_async", "lora_rank=zero", "--url", url}, common...)...)
	require.Equal(t, exitCookbookUsage, code)

	_, code = runLoops(t, "cookbook", "list", "--python", filepath.Join(t.TempDir(), "no-python"), "--cookbook-dir", dir)
	require.Equal(t, exitCookbookEnv, code)
	_, code = runLoops(t, "cookbook", "list", "--python", py, "--cookbook-dir", t.TempDir())
	require.Equal(t, exitCookbookEnv, code)
}

func FuzzCookbookOutputs(f *testing.F) {
	f.Add([]byte(`[{"name":"a","summary":"x"}]`), "model=m")
	f.Add([]byte(`{"checks":[{"check":"c","ok":false,"detail":"d"}],"config":[{"name":"model","default":"x"},{"name":"lora_rank","default":8}]}`), "lora_rank=4")
	f.Add([]byte(`{"config":[{"name":"lora_rank","default":"eight"}]}`), "lora_rank=-1")
	f.Fuzz(func(t *testing.T, out []byte, override string) {
		if rs, err := parseRecipeList(out); err == nil {
			for _, r := range rs {
				require.NotEmpty(t, r.Name)
			}
		}
		if rows, _, _, _, err := parseCheckOutput(out); err == nil {
			for _, r := range rows {
				require.NotEmpty(t, r.Check)
			}
		}
		if s, err := parseSettings(out, []string{override}); err == nil {
			require.NotEmpty(t, s.Model)
			if strings.HasPrefix(override, "lora_rank=") {
				require.Positive(t, s.LoraRank)
			}
		}
	})
}
