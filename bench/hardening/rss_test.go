package hardening

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/bench/benchdata"
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
	bin := benchdata.Binary(t)
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
			srv := benchdata.Serve(t, bin)
			idle := srv.Memory(t)
			statuses := make([]int, concurrency)
			start := time.Now()
			var wg sync.WaitGroup
			for i := range concurrency {
				wg.Go(func() { statuses[i] = post(t, srv.URL+sc.path, body, sc.header) })
			}
			wg.Wait()
			elapsed := time.Since(start)
			peak := srv.Memory(t)
			t.Logf("%s: %d × %d-byte bodies, limit %d MiB; answers %v in %s; idle RSS %d MiB; peak RSS %d MiB = %.2f× the limit (%.2f× above idle)",
				sc.name, concurrency, len(body), sc.limit/mib, statuses, elapsed.Round(time.Millisecond),
				idle.RSS/mib, peak.HWM/mib, float64(peak.HWM)/float64(sc.limit), float64(peak.HWM-idle.RSS)/float64(sc.limit))
		})
	}
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
