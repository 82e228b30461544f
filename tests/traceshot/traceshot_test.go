package traceshot

import (
	"context"
	_ "embed"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

//go:embed timeline.html
var page string

func TestRender(t *testing.T) {
	in := os.Getenv("LOOPS_TRACESHOT_IN")
	if in == "" {
		t.Skip("LOOPS_TRACESHOT_IN names the trace to render")
	}
	out := os.Getenv("LOOPS_TRACESHOT_OUT")
	if out == "" {
		out = "trace.png"
	}
	trace, err := os.ReadFile(in)
	require.NoError(t, err)
	require.True(t, json.Valid(trace), "not JSON")
	html := strings.Replace(page, "/*TRACE*/null", string(trace), 1)
	file := t.TempDir() + "/timeline.html"
	require.NoError(t, os.WriteFile(file, []byte(html), 0o600))

	chromium := os.Getenv("LOOPS_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1600, 900))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, time.Minute)
	defer cancelT()
	var png []byte
	var drawn int
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate("file://"+file),
		chromedp.WaitVisible("#done", chromedp.ByID),
		chromedp.Evaluate(`window.drawnSpans`, &drawn),
		chromedp.FullScreenshot(&png, 100),
	))
	require.Positive(t, drawn, "no span was drawn")
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("%d spans drawn into %s", drawn, out)
}
