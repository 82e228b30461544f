package hardening

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
)

const (
	mib = 1 << 20
	// The server's defaults: compat.DefaultMaxDecompressedBytes for Tinker bodies,
	// compat.DefaultMaxBodyBytes for loops.v1 messages (connect-go's read limit applies to
	// the decompressed message too).
	tinkerLimit  = 256 * mib
	connectLimit = 64 * mib
	bombSize     = 300_000_000
)

type scenario struct {
	name   string
	limit  int64
	path   string
	header map[string]string
	body   func(t *testing.T) []byte
}

func TestRSS(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the memory benchmark of hostile bodies")
	}
	concurrency := 8
	if v := os.Getenv("LOOPS_BENCH_CONCURRENCY"); v != "" {
		var err error
		concurrency, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	bin := os.Getenv("LOOPS_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "loops")
		build := exec.Command("go", "build", "-o", bin, "github.com/loops-dev/loops/cmd/loops")
		build.Stderr = os.Stderr
		require.NoError(t, build.Run())
	}
	zstdHeader := map[string]string{"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}
	gzipHeader := map[string]string{"Content-Type": "application/proto", "Content-Encoding": "gzip"}
	for _, sc := range []scenario{
		{"zstd bomb, size declared", tinkerLimit, "/api/v1/forward_backward", zstdHeader, func(t *testing.T) []byte { return zstdZeros(t, bombSize, true) }},
		{"zstd bomb, size not declared", tinkerLimit, "/api/v1/forward_backward", zstdHeader, func(t *testing.T) []byte { return zstdZeros(t, bombSize, false) }},
		{"zstd at the limit", tinkerLimit, "/api/v1/forward_backward", zstdHeader, func(t *testing.T) []byte { return zstdZeros(t, tinkerLimit, true) }},
		{"gzip bomb on Connect", connectLimit, "/loops.v1.TrainingService/ForwardBackward", gzipHeader, func(t *testing.T) []byte { return gzipZeros(t, bombSize) }},
		{"gzip at the limit on Connect", connectLimit, "/loops.v1.TrainingService/ForwardBackward", gzipHeader, func(t *testing.T) []byte { return gzipZeros(t, connectLimit) }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			body := sc.body(t)
			srv := startServer(t, bin)
			idle := srv.status(t)
			statuses := make([]int, concurrency)
			start := time.Now()
			var wg sync.WaitGroup
			for i := range concurrency {
				wg.Go(func() { statuses[i] = post(t, srv.url+sc.path, body, sc.header) })
			}
			wg.Wait()
			elapsed := time.Since(start)
			peak := srv.status(t)
			t.Logf("%s: %d × %d-byte bodies, limit %d MiB; answers %v in %s; idle RSS %d MiB; peak RSS %d MiB = %.2f× the limit (%.2f× above idle)",
				sc.name, concurrency, len(body), sc.limit/mib, statuses, elapsed.Round(time.Millisecond),
				idle.rss/mib, peak.hwm/mib, float64(peak.hwm)/float64(sc.limit), float64(peak.hwm-idle.rss)/float64(sc.limit))
		})
	}
}

type server struct {
	url string
	pid int
}

type memory struct{ rss, hwm int64 }

// startServer runs `loops serve` on 127.0.0.1:0 with a fresh data folder (open mode) and
// waits until it answers.
func startServer(t *testing.T, bin string) server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-level", "warn")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Loops listening on "); ok {
				urls <- strings.Fields(rest)[0]
			}
		}
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(time.Minute):
		t.Fatal("loops serve did not start")
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond)
	return server{url: url, pid: cmd.Process.Pid}
}

// status reads the server's resident memory now (VmRSS) and at its peak (VmHWM).
func (s server) status(t *testing.T) memory {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	require.NoError(t, err)
	var m memory
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.hwm = kb << 10
		}
	}
	return m
}

func post(t *testing.T, url string, body []byte, header map[string]string) int {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("X-API-Key", "tml-bench")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func zstdZeros(t *testing.T, n int64, declare bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	require.NoError(t, err)
	if declare {
		enc.ResetContentSize(&buf, n)
	} else {
		enc.Reset(&buf)
	}
	writeZeros(t, enc, n)
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

func gzipZeros(t *testing.T, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(t, err)
	writeZeros(t, zw, n)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func writeZeros(t *testing.T, w io.Writer, n int64) {
	t.Helper()
	chunk := make([]byte, mib)
	for left := n; left > 0; left -= int64(len(chunk)) {
		_, err := w.Write(chunk[:min(left, int64(len(chunk)))])
		require.NoError(t, err)
	}
}
