package bounded

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
)

// allocated returns the bytes f allocates (the TotalAlloc delta: every allocation counts,
// even one the GC has already freed).
func allocated(f func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc)
}

// zstdZeros compresses n zero bytes as one streamed frame, declaring its size or not.
func zstdZeros(t testing.TB, n int64, declare bool, opts ...zstd.EOption) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(nil, append([]zstd.EOption{zstd.WithEncoderConcurrency(1)}, opts...)...)
	require.NoError(t, err)
	if declare {
		enc.ResetContentSize(&buf, n)
	} else {
		enc.Reset(&buf)
	}
	chunk := make([]byte, mib)
	for left := n; left > 0; left -= int64(len(chunk)) {
		_, err := enc.Write(chunk[:min(left, int64(len(chunk)))])
		require.NoError(t, err)
	}
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

func requireTooLarge(t *testing.T, err error) {
	t.Helper()
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
}

func requireCorrupt(t *testing.T, err error) {
	t.Helper()
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
}

// TestZstdBombAllocatesNoOutput is the regression test for a 10 KB body that inflates to
// 300 MB: refusing it must not cost an output buffer (it used to cost about 1 GB: a
// bytes.Buffer doubling toward the limit on top of the decoder's window).
func TestZstdBombAllocatesNoOutput(t *testing.T) {
	const limit = 256 * mib
	for _, declare := range []bool{true, false} {
		bomb := zstdZeros(t, 300_000_000, declare)
		require.Less(t, len(bomb), 64<<10)
		var err error
		n := allocated(func() { _, err = Zstd(t.Context(), bomb, limit, nil) })
		requireTooLarge(t, err)
		// Declared: refused from the frame header. Undeclared: one counting pass through
		// the window.
		require.LessOrEqual(t, n, MaxStreamWindow+2*mib, "declared=%v: refusing a bomb allocated %d bytes", declare, n)
		if declare {
			require.LessOrEqual(t, n, mib)
		}
	}
}

// TestZstdAllocatesTheOutputOnce: a body within the limit costs its size once, not a
// doubling buffer.
func TestZstdAllocatesTheOutputOnce(t *testing.T) {
	const size = 48 * mib
	for _, declare := range []bool{true, false} {
		body := zstdZeros(t, size, declare)
		var out []byte
		var err error
		n := allocated(func() { out, err = Zstd(t.Context(), body, 256*mib, nil) })
		require.NoError(t, err)
		require.Len(t, out, int(size))
		window := int64(0)
		if !declare {
			window = 2 * MaxStreamWindow // one window per pass
		}
		require.LessOrEqual(t, n, size+window+2*mib, "declared=%v allocated %d bytes for %d", declare, n, size)
	}
}

// TestZstdLimitIsExact: a body of exactly the limit passes, one byte more does not.
func TestZstdLimitIsExact(t *testing.T) {
	for _, declare := range []bool{true, false} {
		body := zstdZeros(t, 3*mib, declare)
		out, err := Zstd(t.Context(), body, 3*mib, nil)
		require.NoError(t, err)
		require.Len(t, out, int(3*mib))
		_, err = Zstd(t.Context(), body, 3*mib-1, nil)
		requireTooLarge(t, err)
	}
}

// TestZstdFrameThatUnderstatesItsSize: a frame declaring less than it holds fails within a
// block, without reallocating its output.
func TestZstdFrameThatUnderstatesItsSize(t *testing.T) {
	body := zstdZeros(t, 16*mib, true)
	var fcs [4]byte
	binary.LittleEndian.PutUint32(fcs[:], uint32(16*mib))
	i := bytes.Index(body[:zstd.HeaderMaxSize], fcs[:])
	require.Positive(t, i)
	binary.LittleEndian.PutUint32(body[i:], uint32(mib))
	var err error
	n := allocated(func() { _, err = Zstd(t.Context(), body, 256*mib, nil) })
	requireCorrupt(t, err)
	require.LessOrEqual(t, n, 2*mib)
}

func TestZstdWindows(t *testing.T) {
	// A streamed frame with a window over MaxStreamWindow is refused before decoding.
	body := zstdZeros(t, 40*mib, false, zstd.WithWindowSize(32<<20))
	var err error
	n := allocated(func() { _, err = Zstd(t.Context(), body, 256*mib, nil) })
	requireTooLarge(t, err)
	require.ErrorContains(t, err, "window")
	require.LessOrEqual(t, n, mib)
	// A declared one is decoded in place, whatever its window.
	body = zstdZeros(t, 40*mib, true, zstd.WithWindowSize(32<<20))
	var h zstd.Header
	require.NoError(t, h.Decode(body))
	require.False(t, h.SingleSegment)
	require.Equal(t, uint64(32<<20), h.WindowSize)
	var out []byte
	n = allocated(func() { out, err = Zstd(t.Context(), body, 256*mib, nil) })
	require.NoError(t, err)
	require.Len(t, out, int(40*mib))
	require.LessOrEqual(t, n, 41*mib)
}

func TestZstdFramesAndErrors(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	a, b := []byte("hello, "), bytes.Repeat([]byte("world"), 1000)
	skippable := []byte{0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3}
	two := append(append(enc.EncodeAll(a, nil), skippable...), enc.EncodeAll(b, nil)...)
	out, err := Zstd(t.Context(), two, mib, nil)
	require.NoError(t, err)
	require.Equal(t, append(append([]byte{}, a...), b...), out)

	// One frame declares its size, one does not: counted.
	mixed := append(enc.EncodeAll(a, nil), zstdZeros(t, 10*kib, false)...)
	out, err = Zstd(t.Context(), mixed, mib, nil)
	require.NoError(t, err)
	require.Len(t, out, len(a)+int(10*kib))

	out, err = Zstd(t.Context(), nil, mib, nil)
	require.NoError(t, err)
	require.Empty(t, out)

	for _, bad := range [][]byte{
		[]byte("not zstd at all"),
		two[:len(two)-3],
		append(two, 0x28),
		{0x28, 0xb5, 0x2f, 0xfd},
	} {
		_, err := Zstd(t.Context(), bad, mib, nil)
		requireCorrupt(t, err)
	}
	// A corrupted block inside a well-formed frame.
	body := enc.EncodeAll(b, nil)
	body[len(body)/2] ^= 0xff
	_, err = Zstd(t.Context(), body, mib, nil)
	require.Error(t, err)
}

func TestBudget(t *testing.T) {
	b := NewBudget(100, time.Minute)
	h1, err := b.Acquire(t.Context(), 60)
	require.NoError(t, err)
	require.Equal(t, int64(60), b.InUse())
	waiters := func() int { b.mu.Lock(); defer b.mu.Unlock(); return b.waiters.Len() }

	// A waiter that does not fit waits, and a smaller one that would fit waits behind it
	// (first come, first served).
	got := make(chan string, 2)
	for _, w := range []struct {
		name string
		n    int64
	}{{"big", 50}, {"small", 10}} {
		queued := waiters()
		go func() {
			h, err := b.Acquire(context.Background(), w.n)
			if err == nil {
				got <- w.name
				h.Release()
			}
		}()
		require.Eventually(t, func() bool { return waiters() == queued+1 }, 5*time.Second, time.Millisecond)
	}
	require.Equal(t, int64(60), b.InUse())
	h1.Release()
	h1.Release() // releasing twice is harmless
	require.ElementsMatch(t, []string{"big", "small"}, []string{<-got, <-got})
	require.Eventually(t, func() bool { return b.InUse() == 0 }, 5*time.Second, time.Millisecond)

	// More than the budget waits for all of it; Shrink gives back the difference.
	h, err := b.Acquire(t.Context(), 1000)
	require.NoError(t, err)
	require.Equal(t, int64(100), b.InUse())
	h.Shrink(30)
	require.Equal(t, int64(30), b.InUse())

	// A wait ends with the context or the budget's wait, as ErrBusy.
	h2, err := b.Acquire(t.Context(), 70)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(ctx, 1)
	require.ErrorIs(t, err, ErrBusy)
	short := NewBudget(10, 20*time.Millisecond)
	hold, err := short.Acquire(t.Context(), 10)
	require.NoError(t, err)
	_, err = short.Acquire(t.Context(), 1)
	require.ErrorIs(t, err, ErrBusy)
	hold.Release()
	h.Release()
	h2.Release()

	// A waiter at the front that gives up lets the ones behind it in.
	h, err = b.Acquire(t.Context(), 90)
	require.NoError(t, err)
	ctx, cancel = context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := b.Acquire(ctx, 50); errc <- err }()
	require.Eventually(t, func() bool { return waiters() == 1 }, 5*time.Second, time.Millisecond)
	small := make(chan error, 1)
	go func() {
		h, err := b.Acquire(t.Context(), 10)
		h.Release()
		small <- err
	}()
	require.Eventually(t, func() bool { return waiters() == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-errc, ErrBusy)
	require.NoError(t, <-small)
	h.Release()

	// A nil budget grants everything.
	var none *Budget
	h, err = none.Acquire(t.Context(), 1<<40)
	require.NoError(t, err)
	h.Release()
}

// TestBudgetHoldsGarbageUntilCollected: a body's reservation lasts until its buffer is
// really free, and a waiter kept out by it gets it collected instead of waiting for the
// GC's own schedule.
func TestBudgetHoldsGarbageUntilCollected(t *testing.T) {
	b := NewBudget(16*mib, 10*time.Second)
	h, err := b.Acquire(t.Context(), 16*mib)
	require.NoError(t, err)
	buf := make([]byte, 16*mib)
	h.ReleaseWhenCollected(&buf[0])

	// While the buffer is live the budget stays taken.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(ctx, 16*mib)
	require.ErrorIs(t, err, ErrBusy)
	runtime.KeepAlive(buf)

	// Once it is garbage, the next waiter triggers its collection and gets in.
	start := time.Now()
	h, err = b.Acquire(t.Context(), 16*mib)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 5*time.Second)
	h.Release()
	require.Zero(t, b.InUse())
	require.Zero(t, b.collectable)
}

// TestZstdConcurrencyIsBounded: concurrent decompressions never hold more than the budget,
// and the budget comes back once their outputs are garbage.
func TestZstdConcurrencyIsBounded(t *testing.T) {
	b := NewBudget(10*mib, time.Minute)
	body := zstdZeros(t, 4*mib, true)
	var (
		mu   sync.Mutex
		peak int64
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			out, err := Zstd(t.Context(), body, 8*mib, b)
			if err != nil || len(out) != int(4*mib) {
				t.Errorf("got %d bytes, %v", len(out), err)
				return
			}
			mu.Lock()
			peak = max(peak, b.InUse())
			mu.Unlock()
			runtime.Gosched() // let others try while this one holds its output
		})
	}
	wg.Wait()
	require.LessOrEqual(t, peak, 10*mib)
	require.Eventually(t, func() bool { runtime.GC(); return b.InUse() == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestReadAll(t *testing.T) {
	data := make([]byte, 16*mib)
	var out []byte
	var err error
	n := allocated(func() { out, err = ReadAll(bytes.NewReader(data), int64(len(data)), 32*mib) })
	require.NoError(t, err)
	require.Len(t, out, len(data))
	require.LessOrEqual(t, n, 16*mib+kib*64, "a body of known length is allocated once")

	n = allocated(func() { out, err = ReadAll(io.MultiReader(bytes.NewReader(data)), -1, 20*mib) })
	require.NoError(t, err)
	require.Len(t, out, len(data))
	// Doubling from 64 KiB to 16 MiB, then one buffer of limit+1 bytes to see EOF.
	require.LessOrEqual(t, n, 2*16*mib+20*mib+kib, "an unknown length grows up to the limit, never past it")

	var mbe *http.MaxBytesError
	_, err = ReadAll(bytes.NewReader(data), -1, 8*mib)
	require.ErrorAs(t, err, &mbe)
	_, err = ReadAll(bytes.NewReader(data), int64(len(data)), 8*mib)
	require.ErrorAs(t, err, &mbe)
	out, err = ReadAll(bytes.NewReader(nil), 0, 8*mib)
	require.NoError(t, err)
	require.Empty(t, out)
}

func gzipZeros(t testing.TB, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(t, err)
	chunk := make([]byte, mib)
	for left := n; left > 0; left -= int64(len(chunk)) {
		_, err := zw.Write(chunk[:min(left, int64(len(chunk)))])
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// TestGzipBombFailsBeforeOutput: read the way connect-go reads a compressed message, a
// bomb fails on the first Read, before the caller's buffer has grown.
func TestGzipBombFailsBeforeOutput(t *testing.T) {
	const limit = 64 * mib
	bomb := gzipZeros(t, 300_000_000)
	g := &Gzip{Limit: limit, Budget: NewBudget(256*mib, time.Second)}
	var dst bytes.Buffer
	var err error
	n := allocated(func() {
		require.NoError(t, g.Reset(bytes.NewBuffer(bomb)))
		_, err = dst.ReadFrom(io.LimitReader(g, limit+1))
	})
	requireTooLarge(t, err)
	require.Zero(t, dst.Len())
	require.LessOrEqual(t, n, mib)
	require.NoError(t, g.Close())
	require.Zero(t, g.Budget.InUse())
}

func TestGzipStreamsExactly(t *testing.T) {
	body := gzipZeros(t, 5*mib+3)
	b := NewBudget(256*mib, time.Second)
	g := &Gzip{Limit: 8 * mib, Budget: b}
	for range 2 { // reused, as from connect-go's pool
		require.NoError(t, g.Reset(bytes.NewBuffer(body)))
		var dst bytes.Buffer
		n, err := dst.ReadFrom(io.LimitReader(g, 8*mib+1))
		require.NoError(t, err)
		require.Equal(t, 5*mib+3, n)
		require.Positive(t, b.InUse())
		require.NoError(t, g.Close())
		require.Zero(t, b.InUse(), "a buffer of 8 MiB or less may be pooled: released at Close")
	}
	require.NoError(t, g.Reset(bytes.NewBufferString("nope")))
	_, err := io.ReadAll(g)
	requireCorrupt(t, err)
	require.NoError(t, g.Reset(bytes.NewBuffer(body[:len(body)-5])))
	_, err = io.ReadAll(g)
	requireCorrupt(t, err)
}

// TestGzipHoldsTheReadersBuffer: for a body too large for connect-go's buffer pool, the
// reservation is cut to twice the reader's final buffer and lasts until that buffer is
// collected, past Close.
func TestGzipHoldsTheReadersBuffer(t *testing.T) {
	const size = 20 * mib
	b := NewBudget(256*mib, time.Second)
	g := &Gzip{Limit: 64 * mib, Budget: b}
	require.NoError(t, g.Reset(bytes.NewBuffer(gzipZeros(t, size))))
	dst := new(bytes.Buffer)
	n, err := dst.ReadFrom(io.LimitReader(g, 64*mib+1))
	require.NoError(t, err)
	require.Equal(t, size, n)
	require.NoError(t, g.Close())
	require.Equal(t, 2*int64(dst.Cap())+gzipWorkingSet, b.InUse())
	runtime.KeepAlive(dst) // and no further
	require.Eventually(t, func() bool { runtime.GC(); return b.InUse() == 0 }, 5*time.Second, 10*time.Millisecond)
}
