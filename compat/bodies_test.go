package compat

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/bounded"
)

// zstdZeros compresses n zero bytes as one streamed frame, declaring its size or not.
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
	chunk := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(chunk)) {
		_, err := enc.Write(chunk[:min(left, int64(len(chunk)))])
		require.NoError(t, err)
	}
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

// allocatedServing serves one request in this goroutine and returns its response and the
// bytes allocated meanwhile (TotalAlloc: freed allocations count too).
func allocatedServing(h http.Handler, r *http.Request) (*httptest.ResponseRecorder, int64) {
	var before, after runtime.MemStats
	w := httptest.NewRecorder()
	runtime.GC()
	runtime.ReadMemStats(&before)
	h.ServeHTTP(w, r)
	runtime.ReadMemStats(&after)
	return w, int64(after.TotalAlloc - before.TotalAlloc)
}

func zstdRequest(body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/api/v1/forward_backward", bytes.NewReader(body))
	r.Header.Set("Content-Type", contentTypeProto)
	r.Header.Set("Content-Encoding", "zstd")
	return r
}

// TestZstdBombMemoryIsBounded is the regression test for a 10 KB body inflating to 300 MB
// at the default limits: it used to cost about 1 GB (a bytes.Buffer doubling toward the
// 256 MiB limit on top of a decoder window) before its 413. Now a declared bomb is refused
// from its frame header and an undeclared one after one counting pass through an 8 MiB
// window; neither allocates an output buffer.
func TestZstdBombMemoryIsBounded(t *testing.T) {
	h := NewHandler(newFakeCore().services(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, declare := range []bool{true, false} {
		bomb := zstdZeros(t, 300_000_000, declare)
		require.Less(t, len(bomb), 64<<10)
		w, n := allocatedServing(h, zstdRequest(bomb))
		require.Equal(t, http.StatusRequestEntityTooLarge, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), "limit of 268435456 bytes")
		t.Logf("declared=%v: refusing a %d-byte bomb allocated %d bytes", declare, len(bomb), n)
		require.LessOrEqual(t, n, int64(bounded.MaxStreamWindow+4<<20), "declared=%v: refusing the bomb allocated %d bytes", declare, n)
	}
}

// TestZstdBodyWithinTheLimitAllocatesItOnce: a body that decompresses to 64 MiB costs
// 64 MiB (plus small change), not a buffer doubled past it.
func TestZstdBodyWithinTheLimitAllocatesItOnce(t *testing.T) {
	h := NewHandler(newFakeCore().services(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	const size = 64 << 20
	w, n := allocatedServing(h, zstdRequest(zstdZeros(t, size, true)))
	// Zeros are not a valid ForwardBackwardRequest: the decoder refuses them at once.
	require.Equal(t, http.StatusBadRequest, w.Code, w.Body.String())
	t.Logf("decompressing %d bytes allocated %d", size, n)
	require.LessOrEqual(t, n, int64(size+4<<20), "decompressing %d bytes allocated %d", size, n)
}

// TestZstdBodiesShareTheBudget: a compressed body waits for room in the decompression
// budget and, when none comes in time, is answered 429 with the reason; its own reservation
// ends once its decompressed body has been collected.
func TestZstdBodiesShareTheBudget(t *testing.T) {
	budget := bounded.NewBudget(8<<20, 200*time.Millisecond)
	e := newEnv(t, func(o *Options) { o.DecompressBudget = budget })
	_, run := e.newRun()
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	body := enc.EncodeAll(fbProtoBody(t, run), nil)
	headers := map[string]string{"Content-Type": contentTypeProto, "Content-Encoding": "zstd"}

	hold, err := budget.Acquire(context.Background(), budget.Size())
	require.NoError(t, err)
	r := e.do("POST", "/api/v1/forward_backward", body, headers)
	require.Equal(t, http.StatusTooManyRequests, r.status, string(r.body))
	require.Contains(t, r.json(t)["detail"], "decompressing other request bodies")

	hold.Release()
	r = e.do("POST", "/api/v1/forward_backward", body, headers)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	// The decompressed body stays reserved until it has been collected.
	require.Eventually(t, func() bool { runtime.GC(); return budget.InUse() == 0 }, 5*time.Second, 10*time.Millisecond)
}
