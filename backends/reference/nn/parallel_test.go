package nn

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParallelFor checks that parallelFor runs every index exactly once from concurrent
// and nested callers, raises a task's panic on the caller (the next call still works), and
// that its idle workers end.
func TestParallelFor(t *testing.T) {
	defer SetThreads(Threads())
	SetThreads(4)
	before := runtime.NumGoroutine()
	const n = 1000
	var counts [4][n]atomic.Int32
	done := make(chan struct{})
	for c := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 20 {
				parallelFor(n, 1<<20, func(i int) {
					counts[c][i].Add(1)
					if i%100 == 0 {
						parallelFor(3, 1<<20, func(int) {}) // nested
					}
				})
			}
		}()
	}
	for range 4 {
		<-done
	}
	for c := range counts {
		for i := range counts[c] {
			require.EqualValues(t, 20, counts[c][i].Load(), "caller %d index %d", c, i)
		}
	}
	require.PanicsWithError(t, "boom", func() {
		defer func() {
			if p, ok := recover().(*workerPanic); ok {
				panic(p.value)
			}
		}()
		parallelFor(n, 1<<20, func(i int) {
			if i == 7 {
				panic(errBoom{})
			}
		})
	})
	var ran atomic.Int32
	parallelFor(n, 1<<20, func(int) { ran.Add(1) })
	require.EqualValues(t, n, ran.Load())
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before, "idle workers end")
}

type errBoom struct{}

func (errBoom) Error() string { return "boom" }
