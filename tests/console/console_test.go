//go:build console

package console

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

const keyAlice, keyBob = "tml-console-alice", "tml-console-bob"

// need returns an environment variable or a binary the test needs: missing, it fails under
// CI=true and skips otherwise.
func need(t *testing.T, what, value string) string {
	t.Helper()
	if value == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (CI=true): run the test through make test-console, which provides it", what)
		}
		t.Skipf("%s is missing: run make test-console", what)
	}
	return value
}

// serve builds loops, starts `loops serve` with Alice's and Bob's keys on a fresh data
// folder and returns its URL.
func serve(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "loops")
	build := exec.Command("go", "build", "-o", bin, "./cmd/loops")
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	// A price sheet: the run page charts the run's cost beside its loss, the usage page the month's.
	prices := filepath.Join(dir, "prices.yaml")
	require.NoError(t, os.WriteFile(prices, []byte("models:\n  \"*\": {prefill: \"0.20\", sample: \"0.60\", train: \"0.40\"}\n"), 0o600))
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--api-key", keyAlice+"=alice", "--api-key", keyBob+"=bob", "--prices", prices)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	log, err := os.Create(filepath.Join(dir, "server.log"))
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = log.Close()
	})
	urls := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`Loops listening on (http://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(log, sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case urls <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case u := <-urls:
		return u
	case <-time.After(60 * time.Second):
		t.Fatal("loops serve did not print its URL within 60 s; see server.log in " + dir)
		return ""
	}
}

// shooter saves numbered full-page screenshots.
type shooter struct {
	t   *testing.T
	dir string
	n   int
}

func (s *shooter) shot(name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		var png []byte
		if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
			return err
		}
		s.n++
		p := filepath.Join(s.dir, fmt.Sprintf("%02d-%s.png", s.n, name))
		s.t.Logf("screenshot %s", p)
		return os.WriteFile(p, png, 0o644)
	})
}

// points reads a chart's data-points.
func points(ctx context.Context, t *testing.T, chart string) int {
	t.Helper()
	var v string
	var ok bool
	require.NoError(t, chromedp.Run(ctx, chromedp.AttributeValue("#chart-"+chart, "data-points", &v, &ok, chromedp.ByQuery)))
	require.True(t, ok)
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

func TestConsoleInBrowser(t *testing.T) {
	python := need(t, "LOOPS_CONSOLE_PYTHON (a python with the tinker SDK)", os.Getenv("LOOPS_CONSOLE_PYTHON"))
	chromium, _ := exec.LookPath("chromium")
	if p := os.Getenv("LOOPS_CHROMIUM"); p != "" {
		chromium = p
	}
	chromium = need(t, "chromium (Debian's chromium package)", chromium)

	dir := t.TempDir()
	shots := os.Getenv("LOOPS_CONSOLE_SHOTS")
	if shots == "" {
		var err error
		shots, err = os.MkdirTemp("", "loops-console-shots-")
		require.NoError(t, err)
	}
	require.NoError(t, os.MkdirAll(shots, 0o755))
	fmt.Printf("console screenshots: %s\n", shots)
	sh := &shooter{t: t, dir: shots}
	base := serve(t, dir)

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(filepath.Join(dir, "chromium")))...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 8*time.Minute)
	defer cancel()
	// Start the browser on the test's context: steps run on shorter-lived ones.
	require.NoError(t, chromedp.Run(ctx), "starting chromium")
	// run runs one step within 90 s; a failed step leaves a FAILED screenshot.
	run := func(what string, actions ...chromedp.Action) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 90*time.Second)
		defer scancel()
		if err := chromedp.Run(sctx, actions...); err != nil {
			fctx, fcancel := context.WithTimeout(bctx, 15*time.Second)
			defer fcancel()
			_ = chromedp.Run(fctx, sh.shot("FAILED-"+strings.ReplaceAll(what, " ", "-")))
			t.Fatalf("%s: %v", what, err)
		}
	}
	signIn := func(key string) {
		run("sign in", chromedp.Navigate(base+"/"), chromedp.WaitVisible("#api_key", chromedp.ByID),
			chromedp.SendKeys("#api_key", key, chromedp.ByID), chromedp.Click("#signin", chromedp.ByID))
	}

	// Sign-in: / sends to the sign-in page; a wrong key is refused there.
	run("sign-in page", chromedp.Navigate(base+"/"), chromedp.WaitVisible("#api_key", chromedp.ByID), sh.shot("signin"))
	signIn("tml-wrong")
	var msg string
	run("refused", chromedp.WaitVisible("#signin-error", chromedp.ByID), chromedp.Text("#signin-error", &msg, chromedp.ByID), sh.shot("signin-refused"))
	require.Contains(t, msg, "unknown API key")
	signIn(keyAlice)
	run("no runs yet", chromedp.WaitVisible("#no-runs", chromedp.ByID), sh.shot("runs-empty"))

	// A tinker script trains: its run appears in the live list without a reload.
	script := exec.CommandContext(ctx, python, "train.py", "8", "2")
	script.Env = append(os.Environ(), "TINKER_BASE_URL="+base, "TINKER_API_KEY="+keyAlice, "HF_HUB_OFFLINE=1")
	out, err := os.Create(filepath.Join(dir, "train.log"))
	require.NoError(t, err)
	script.Stdout, script.Stderr = out, out
	require.NoError(t, script.Start())
	finished := make(chan error, 1)
	go func() { finished <- script.Wait() }()
	trainLog := func() string { b, _ := os.ReadFile(filepath.Join(dir, "train.log")); return string(b) }

	var runID string
	var ok bool
	run("run appears", chromedp.WaitVisible("#runs tr[data-run]", chromedp.ByQuery),
		chromedp.AttributeValue("#runs tr[data-run]", "data-run", &runID, &ok, chromedp.ByQuery), sh.shot("runs-live"))
	require.True(t, ok)
	require.Regexp(t, `^run-`, runID)

	// Its page: the loss chart gains points as steps land, without a reload.
	run("run page", chromedp.Click(`#runs a[href="/console/runs/`+runID+`"]`, chromedp.ByQuery), chromedp.WaitVisible("#chart-loss", chromedp.ByID))
	first := points(ctx, t, "loss")
	run("first points", sh.shot("run-early"))
	deadline := time.Now().Add(3 * time.Minute)
	for points(ctx, t, "loss") <= first {
		require.True(t, time.Now().Before(deadline), "the loss chart did not gain points past %d; train.log:\n%s", first, trainLog())
		time.Sleep(500 * time.Millisecond)
	}
	var refreshed string
	run("live refresh", chromedp.AttributeValue("#run-live", "data-refreshed", &refreshed, &ok, chromedp.ByID))
	require.True(t, ok, "the points came by the live refresh")
	run("alert shown", chromedp.WaitVisible(`#alerts li[data-rule="kl_sample_train"]`, chromedp.ByQuery), sh.shot("run-more-points"))

	select {
	case err := <-finished:
		require.NoError(t, err, "train.py:\n%s", trainLog())
	case <-time.After(4 * time.Minute):
		t.Fatalf("train.py did not finish in time:\n%s", trainLog())
	}
	require.Contains(t, trainLog(), "done")
	run("finished run", chromedp.Reload(), chromedp.WaitVisible(`tr[data-checkpoint="ck-early"]`, chromedp.ByQuery))
	require.GreaterOrEqual(t, points(ctx, t, "loss"), 16) // 8 steps × (cross_entropy, importance_sampling)
	require.Equal(t, 8, points(ctx, t, "tokens"))
	require.Equal(t, 16, points(ctx, t, "norms")) // 8 optim_steps × (gradient, update) norm
	// The eval attached by train.py scored both sampler saves: charted beside the loss.
	deadline = time.Now().Add(2 * time.Minute)
	for {
		run("eval chart", chromedp.Reload(), chromedp.WaitVisible("#chart-evals", chromedp.ByID))
		if points(ctx, t, "evals") >= 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the eval chart did not get both saves' scores")
		time.Sleep(500 * time.Millisecond)
	}
	// Priced by the sheet: the run's cost so far, a point per forward_backward (8 steps × 2 losses).
	require.Equal(t, 16, points(ctx, t, "cost"))
	run("finished run shot", sh.shot("run-finished"))

	// The toggles: EMA and log scale redraw the charts and stay in the page's URL.
	var loc string
	run("toggles", chromedp.Click("#toggle-ema", chromedp.ByID), chromedp.Click("#toggle-log", chromedp.ByID))
	deadline = time.Now().Add(30 * time.Second)
	for {
		run("location", chromedp.Location(&loc))
		var live string
		run("live url", chromedp.AttributeValue("#run-live", "data-live", &live, &ok, chromedp.ByID))
		if strings.Contains(loc, "ema=1") && strings.Contains(loc, "log=1") && strings.Contains(live, "ema=1&log=1") {
			break
		}
		require.True(t, time.Now().Before(deadline), "toggles not applied: %s", loc)
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // the refresh the toggle started
	run("toggled shot", sh.shot("run-ema-log"))

	// A checkpoint: open it, publish it, delete it after the confirmation page.
	run("open checkpoint", chromedp.Click(`tr[data-checkpoint="ck-early"] a`, chromedp.ByQuery), chromedp.WaitVisible("#checkpoint", chromedp.ByID), sh.shot("checkpoint"))
	run("publish", chromedp.Click("#publish", chromedp.ByID), chromedp.WaitVisible("#done", chromedp.ByID), chromedp.Text("#visibility", &msg, chromedp.ByID), sh.shot("checkpoint-published"))
	require.Equal(t, "public", strings.TrimSpace(msg))
	run("delete", chromedp.Click("#delete", chromedp.ByID), chromedp.WaitVisible("#confirm-delete", chromedp.ByID), sh.shot("delete-confirm"))
	run("confirm", chromedp.Click("#confirm-delete", chromedp.ByID), chromedp.WaitVisible(`tr[data-checkpoint="ck-final"]`, chromedp.ByQuery))
	var html string
	run("after delete", chromedp.OuterHTML("#checkpoints", &html, chromedp.ByID), sh.shot("after-delete"))
	require.NotContains(t, html, `data-checkpoint="ck-early"`)
	require.Contains(t, html, `data-checkpoint="sampler-final"`)

	// Usage, sessions and limits.
	run("usage", chromedp.Navigate(base+"/console/usage"), chromedp.WaitVisible("#usage-totals", chromedp.ByID), chromedp.Text("#usage-totals", &msg, chromedp.ByID), sh.shot("usage"))
	require.Contains(t, msg, "training_tokens")
	require.Contains(t, msg, "sampling_sample_tokens")
	require.Contains(t, msg, "Cost (USD)")
	run("usage month", chromedp.Text("#usage-month", &msg, chromedp.ByID))
	require.Contains(t, msg, "This month (UTC) so far")
	// The sampler train.py sampled from: a session's list of samplers is written behind, so
	// reload until it is there.
	deadline = time.Now().Add(60 * time.Second)
	for {
		run("sessions", chromedp.Navigate(base+"/console/sessions"), chromedp.WaitVisible(`a[href="/console/runs/`+runID+`"]`, chromedp.ByQuery),
			chromedp.OuterHTML("main", &html, chromedp.ByQuery))
		if strings.Contains(html, runID+"/sampler_weights/sampler-final") {
			break
		}
		require.True(t, time.Now().Before(deadline), "the sessions page does not list train.py's sampler:\n%s", html)
		time.Sleep(time.Second)
	}
	run("sessions shot", sh.shot("sessions"))
	run("limits", chromedp.Navigate(base+"/console/limits"), chromedp.WaitVisible("#limits", chromedp.ByID), sh.shot("limits"))

	// Bob: none of Alice's runs, not even by its address.
	run("sign out", chromedp.Click("form.signout button", chromedp.ByQuery), chromedp.WaitVisible("#api_key", chromedp.ByID))
	signIn(keyBob)
	run("bob's runs", chromedp.WaitVisible("#no-runs", chromedp.ByID), chromedp.OuterHTML("main", &html, chromedp.ByQuery), sh.shot("bob-runs"))
	require.NotContains(t, html, runID)
	run("bob opens alice's run", chromedp.Navigate(base+"/console/runs/"+runID), chromedp.WaitVisible("#error", chromedp.ByID),
		chromedp.Text("#error", &msg, chromedp.ByID), sh.shot("bob-alice-run"))
	require.Contains(t, msg, "not found")
	run("bob's usage", chromedp.Navigate(base+"/console/usage"), chromedp.WaitVisible("main h1", chromedp.ByQuery), chromedp.OuterHTML("main", &html, chromedp.ByQuery))
	require.NotContains(t, html, "training_tokens")
}
