package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// tinyAdapter writes loops/tiny into dataDir's models folder and returns the files of a
// rank-4 attention adapter for it.
func tinyAdapter(t *testing.T, dataDir string) map[string][]byte {
	t.Helper()
	tinyDir := filepath.Join(dataDir, "models", "loops-tiny")
	require.NoError(t, tiny.Write(tinyDir))
	m, err := nn.Load[float32](tinyDir)
	require.NoError(t, err)
	a, err := nn.NewAdapter(m, nn.LoraConfig{Rank: 4, Seed: 9, Attn: true})
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "adapter")
	_, err = nn.SaveAdapter(dir, a, tiny.Name, false)
	require.NoError(t, err)
	return adapterFiles(t, dir)
}

// tinyAdapterTar returns a tar of tinyAdapter's files.
func tinyAdapterTar(t *testing.T, dataDir string) []byte {
	t.Helper()
	return tarOf(t, tinyAdapter(t, dataDir))
}

// waiter returns a function that waits for an operation of key's to end and requires that
// it succeeded.
func waiter(t *testing.T, url, key string) func(*loopsv1.Operation) *loopsv1.Operation {
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(key))
	return func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
			op = must(ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
		return op
	}
}

// stalledImport sends an import's headers and the first bytes of its body over HTTP/1.1
// from its own connection, then stalls; read its answer from the returned reader.
func stalledImport(t *testing.T, addr, key string, body []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	q := neturl.Values{"base_model": {tiny.Name}, "name": {"stalled"}}
	_, err = fmt.Fprintf(conn, "POST /v1/checkpoint_imports?%s HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\n"+
		"Content-Type: application/x-tar\r\nContent-Length: %d\r\n\r\n", q.Encode(), addr, key, len(body))
	require.NoError(t, err)
	_, err = conn.Write(body[:512])
	require.NoError(t, err)
	return conn, bufio.NewReader(conn)
}

// TestImportSlotsAreSharedBetweenWorkspaces: one workspace trickling imports cannot hold
// every import slot of the server: its second import at once is refused (429, naming the
// per-workspace share), and another workspace still imports.
func TestImportSlotsAreSharedBetweenWorkspaces(t *testing.T) {
	dataDir := t.TempDir()
	addr := startServerWith(t, func(c *gateway.Config) { c.DataDir = dataDir })
	body := tinyAdapterTar(t, dataDir)

	// Workspace A starts two imports and stalls both.
	var answers []*http.Response
	for range 2 {
		conn, r := stalledImport(t, addr, keyA, body)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(3*time.Second)))
		resp, err := http.ReadResponse(r, nil)
		if err == nil {
			answers = append(answers, resp)
		}
	}
	require.Len(t, answers, 1, "one of workspace A's two stalled imports is refused at once, the other holds its slot")
	b, _ := io.ReadAll(answers[0].Body)
	require.Equal(t, http.StatusTooManyRequests, answers[0].StatusCode, "%s", b)
	require.Contains(t, string(b), "max_imports_per_workspace")
	require.NotEmpty(t, answers[0].Header.Get("Retry-After"))

	// Workspace B imports while A still holds its slot.
	st, out := importTar(t, "http://"+addr, keyB, tiny.Name, "b", body)
	require.Equal(t, http.StatusOK, st, "%s", out)
}

// savedCheckpoint creates a loops/tiny run for key (attention, MLP and head adapted) and
// saves its sampler weights; it returns the checkpoint's path.
func savedCheckpoint(t *testing.T, url, key string) string {
	t.Helper()
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(key))
	wait := waiter(t, url, key)
	run := wait(must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 3, TrainAttn: true, TrainMlp: true, TrainUnembed: true},
	}))).GetTrainingRun().GetId()
	return wait(must(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "final",
		Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))).GetSaveWeights().GetPath()
}

// getExport starts a merged export of path for key and returns the response, body unread.
func getExport(t *testing.T, ctx context.Context, url, key, path string) *http.Response {
	t.Helper()
	q := neturl.Values{"path": {path}, "format": {"merged"}}
	req, err := http.NewRequestWithContext(ctx, "GET", url+"/v1/checkpoint_exports?"+q.Encode(), nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	// A client of its own per request: an unread response keeps its connection.
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
	require.NoError(t, err)
	return resp
}

// TestExportSlotsAreSharedBetweenWorkspaces: one workspace leaving merged exports unread
// cannot hold every export slot: its second export at once is refused (429, naming the
// per-workspace share) while another workspace still exports; and the unread export is cut
// once it moves slower than the minimum rate, which frees its slot.
func TestExportSlotsAreSharedBetweenWorkspaces(t *testing.T) {
	addr := startServerWith(t, func(c *gateway.Config) {
		c.Transfers.MinRate = 1 << 20
		c.Transfers.RateWindow = 500 * time.Millisecond
	})
	url := "http://" + addr
	pathA := savedCheckpoint(t, url, keyA)
	pathB := savedCheckpoint(t, url, keyB)

	// Workspace A: two merged exports, neither read (loops/tiny merged is ~13 MB, more
	// than the sockets buffer, so the server blocks writing each).
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := getExport(t, ctx, url, keyA, pathA)
	require.Equal(t, http.StatusOK, first.StatusCode)
	defer first.Body.Close()
	second := getExport(t, ctx, url, keyA, pathA)
	b, _ := io.ReadAll(second.Body)
	second.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, second.StatusCode, "%s", b)
	require.Contains(t, string(b), "max_exports_per_workspace")
	require.NotEmpty(t, second.Header.Get("Retry-After"))

	// Workspace B exports in full meanwhile.
	resp := getExport(t, t.Context(), url, keyB, pathB)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Greater(t, n, int64(10<<20))
	require.False(t, strings.Contains(resp.Header.Get("Content-Type"), "json"))

	// A's unread export stalls under the minimum rate and is cut: its download fails, and
	// A exports again.
	require.Eventually(t, func() bool {
		again := getExport(t, t.Context(), url, keyA, pathA)
		defer again.Body.Close()
		if again.StatusCode != http.StatusOK {
			return false
		}
		_, err := io.Copy(io.Discard, again.Body)
		return err == nil
	}, 10*time.Second, 200*time.Millisecond)
	got, err := io.Copy(io.Discard, first.Body)
	require.Error(t, err, "the stalled download was cut short")
	require.Less(t, got, n)
}

// trickle writes body to w in chunks of n bytes, one every gap, then closes w.
func trickle(w *io.PipeWriter, body []byte, n int, gap time.Duration) {
	for len(body) > 0 {
		k := min(n, len(body))
		if _, err := w.Write(body[:k]); err != nil {
			return
		}
		body = body[k:]
		time.Sleep(gap)
	}
	_ = w.Close()
}

// postImport posts an import whose body comes from r (HTTP/1.1, chunked).
func postImport(t *testing.T, url, key string, r io.Reader) (int, string, time.Duration) {
	t.Helper()
	q := neturl.Values{"base_model": {tiny.Name}, "name": {"slow"}}
	req, err := http.NewRequestWithContext(t.Context(), "POST", url+"/v1/checkpoint_imports?"+q.Encode(), r)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

// TestSlowImportOutlastsTheBodyTimeout: an import is not bound by the body read timeout of
// other requests: one arriving over several body timeouts, above the minimum rate, is
// taken. The rate window (3 s) is wide enough that the trickling goroutine stalling for a
// second on a loaded CI machine under -race does not take the body under the rate (at 1 s
// it did: 408).
func TestSlowImportOutlastsTheBodyTimeout(t *testing.T) {
	dataDir := t.TempDir()
	addr := startServerWith(t, func(c *gateway.Config) {
		c.DataDir = dataDir
		c.Limits.BodyReadTimeout = 300 * time.Millisecond
		c.Transfers.MinRate = 1 << 10
		c.Transfers.RateWindow = 3 * time.Second
	})
	body := tinyAdapterTar(t, dataDir)
	pr, pw := io.Pipe()
	go trickle(pw, body, len(body)/12+1, 100*time.Millisecond) // ~1.2 s in all
	st, out, took := postImport(t, "http://"+addr, keyA, pr)
	require.Equal(t, http.StatusOK, st, out)
	require.Greater(t, took, time.Second)
}

// TestTrickledImportIsCut: an import arriving slower than the minimum rate is cut with a
// 408 that names the rate, not an internal timeout, and frees its slot.
func TestTrickledImportIsCut(t *testing.T) {
	dataDir := t.TempDir()
	addr := startServerWith(t, func(c *gateway.Config) {
		c.DataDir = dataDir
		c.Limits.BodyReadTimeout = time.Minute
		c.Transfers.MinRate = 64 << 10
		c.Transfers.RateWindow = 500 * time.Millisecond
	})
	body := tinyAdapterTar(t, dataDir)
	pr, pw := io.Pipe()
	go trickle(pw, body, 100, 50*time.Millisecond) // 2 KB/s
	st, out, took := postImport(t, "http://"+addr, keyA, pr)
	require.Equal(t, http.StatusRequestTimeout, st, out)
	require.Contains(t, out, "65536 bytes/s")
	require.NotContains(t, out, "i/o timeout")
	require.Less(t, took, 10*time.Second)
	_ = pr.Close()

	// The slot is free again.
	st, b := importTar(t, "http://"+addr, keyA, tiny.Name, "after", body)
	require.Equal(t, http.StatusOK, st, "%s", b)
}
