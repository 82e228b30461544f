package nn

import (
	"fmt"
	"math/bits"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Float is the element type the engine computes in: float32 for serving, float64 for
// reference checks in tests.
type Float interface{ ~float32 | ~float64 }

var threads atomic.Int32

// dotF32 is the vectorised float32 dot product (nil: none; set by kernels_amd64.go).
var dotF32 func(a, b []float32) float32

func init() { threads.Store(int32(runtime.NumCPU())) }

// SetThreads sets how many goroutines the matrix kernels use (at least 1).
func SetThreads(n int) {
	if n < 1 {
		n = 1
	}
	threads.Store(int32(n))
}

// Threads reports the number of goroutines the kernels use.
func Threads() int { return int(threads.Load()) }

// parallelFor runs fn(i) for i in [0,n) on up to Threads() goroutines (see parallelRun).
// fn escapes to the heap: a closure that captures anything costs an allocation per call,
// so the products and other regions of a training step use parallelRun with pooled tasks.
func parallelFor(n int, work int, fn func(i int)) {
	if !runsParallel(n, work) {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	parallelRun(n, work, funcTask(fn))
}

// A task is the body of a parallel region: do(i) runs index i. A pointer to a pooled
// struct passed as a task allocates nothing, unlike a closure.
type task interface{ do(i int) }

// pooled takes a *V from p, or a new one when p is empty or hands out another type (a
// pool serves one instantiation of a generic task but is shared by all).
func pooled[V any](p *sync.Pool) *V {
	if v, ok := p.Get().(*V); ok {
		return v
	}
	return new(V)
}

// runPooled runs parallelRun(n, work, t) for a task t taken from pool and set to v, then
// clears t (the pool keeps none of the caller's arrays) and hands it back: a parallel
// region that allocates nothing.
func runPooled[V any, P interface {
	*V
	task
}](pool *sync.Pool, n, work int, v V) {
	t := pooled[V](pool)
	*t = v
	parallelRun(n, work, P(t))
	var zero V
	*t = zero
	pool.Put(t)
}

// bufPool holds work arrays between uses by size class (powers of two), so an array handed
// back serves the next request of its class rather than being dropped for a larger one.
// Arrays come back with their old contents.
type bufPool[E any] struct{ classes [48]sync.Pool }

// get returns an array of n elements (capacity the next power of two).
func (p *bufPool[E]) get(n int) *[]E {
	c := bits.Len(uint(max(n, 1) - 1))
	if b, ok := p.classes[c].Get().(*[]E); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]E, n, 1<<c)
	return &b
}

// put hands b back for reuse.
func (p *bufPool[E]) put(b *[]E) {
	if c := bits.Len(uint(cap(*b) - 1)); cap(*b) == 1<<c && c < len(p.classes) {
		p.classes[c].Put(b)
	}
}

// funcTask runs a closure as a task.
type funcTask func(i int)

func (f funcTask) do(i int) { f(i) }

// parallelRun runs t.do(i) for i in [0,n) on up to Threads() goroutines, handing out
// indices dynamically: the caller's and other workers' (parallelWorker): one that is still
// spinning after its last job takes the call at once; idle ones are woken, and new ones
// start only when none is idle, so a call starts no goroutine in the steady state. work is
// a rough cost estimate of the whole job; small jobs run inline. A panic of t.do is raised
// again on the caller's goroutine (a *workerPanic) once every index has stopped. No
// goroutine calls t after parallelRun returns.
func parallelRun(n int, work int, t task) {
	if !runsParallel(n, work) {
		for i := 0; i < n; i++ {
			t.do(i)
		}
		return
	}
	nt := min(Threads(), n)
	// A job goes back to the pool when its last holder lets it go: the caller, and each
	// worker handed it (by the offer or the channel) holds a reference; a worker may still
	// hold it after the call returns (it then finds no index left and touches nothing else).
	j := parallelJobs.Get().(*parallelJob)
	j.t, j.n = t, int64(n)
	j.next.Store(0)
	j.refs.Store(1)
	helpers := nt - 1
	if spinningWorkers.Load() > 0 {
		j.refs.Add(1)
		if old := offered.Swap(j); old != nil { // another call's offer nobody took
			old.release()
		}
		helpers--
	}
	for ; helpers > 0; helpers-- {
		j.refs.Add(1)
		select {
		case idleWorkers <- j:
		default:
			go parallelWorker(j)
		}
	}
	j.run(false)
	// An offer no worker took would keep t (and what it holds) alive until the next one.
	if offered.CompareAndSwap(j, nil) {
		j.release()
	}
	// Every index is taken; wait for the workers still running one.
	j.wait()
	p := j.panicked.Swap(nil)
	j.release()
	if p != nil {
		panic(p)
	}
}

// parallelMinWork is the work estimate below which parallelFor runs inline.
const parallelMinWork = 1 << 15

// runsParallel says whether parallelRun(n, work, …) uses more than one goroutine, so a
// caller can skip building a closure for it.
func runsParallel(n, work int) bool { return n > 1 && Threads() > 1 && work >= parallelMinWork }

// parallelJob is one parallelFor call, shared by the goroutines that run its indices.
type parallelJob struct {
	t        task
	n        int64
	next     atomic.Int64
	active   atomic.Int32 // goroutines inside run
	refs     atomic.Int32 // holders: the caller and the workers handed it
	panicked atomic.Pointer[workerPanic]
	// waiting is 1 while the caller blocks (or is about to) in wait; whoever moves it back
	// to 0 owns the wake-up: the worker that leaves run last sends on wake, or the caller
	// that finds no worker left takes its own flag back.
	waiting atomic.Int32
	wake    chan struct{}
}

// callerSpin is how long parallelRun's caller polls for the workers still running an
// index of its job before it blocks until the last one leaves: a worker preempted by the
// OS in the middle of an index (a loaded machine) would otherwise keep the caller spinning
// a whole time slice, CPU time taken from the other processes for nothing.
const callerSpin = 50 * time.Microsecond

// wait returns once no goroutine is inside j.run: it polls for up to callerSpin, yielding
// its thread in between, then blocks.
func (j *parallelJob) wait() {
	if j.active.Load() == 0 {
		return
	}
	deadline := time.Now().Add(callerSpin)
	for i := 1; j.active.Load() > 0; i++ {
		if i%16 == 0 && time.Now().After(deadline) {
			j.waiting.Store(1)
			if j.active.Load() == 0 && j.waiting.CompareAndSwap(1, 0) {
				return // the last worker left before it could see the flag
			}
			<-j.wake
			return
		}
		runtime.Gosched()
	}
}

// release lets go of one reference; the last returns j to the pool.
func (j *parallelJob) release() {
	if j.refs.Add(-1) == 0 {
		j.t = nil
		parallelJobs.Put(j)
	}
}

// run runs indices of j until none is left; a panic stops the job (no new index starts)
// and is kept for the caller. A worker (spin set) counts itself among the spinning workers
// before the caller can see the job end, so the caller's next job is offered to it rather
// than starting another goroutine; it then must call spinForJob.
func (j *parallelJob) run(spin bool) {
	j.active.Add(1)
	defer func() {
		if v := recover(); v != nil {
			// A panic on a worker goroutine cannot be recovered by the caller; carry it
			// over and raise it again on the calling goroutine.
			j.panicked.CompareAndSwap(nil, &workerPanic{v, debug.Stack()})
			j.next.Store(j.n)
		}
		if spin {
			spinningWorkers.Add(1)
		}
		if j.active.Add(-1) == 0 && j.waiting.CompareAndSwap(1, 0) {
			j.wake <- struct{}{} // the caller blocked in wait (buffered: never blocks)
		}
	}()
	for {
		i := j.next.Add(1) - 1
		if i >= j.n {
			return
		}
		j.t.do(int(i))
	}
}

var (
	// parallelJobs recycles parallelFor's jobs.
	parallelJobs = sync.Pool{New: func() any { return &parallelJob{wake: make(chan struct{}, 1)} }}
	// idleWorkers hands a job to a worker waiting for one.
	idleWorkers = make(chan *parallelJob)
	// offered is the job offered to spinning workers; its caller takes it back if no worker
	// did by the time it has run the indices itself.
	offered atomic.Pointer[parallelJob]
	// spinningWorkers counts workers polling offered.
	spinningWorkers atomic.Int32
)

const (
	// workerSpin is how long a worker polls for the next job after one, yielding its
	// thread in between, before it blocks: the products of a decoding step come tens of
	// microseconds apart, and waking a blocked thread costs about as much in a VM.
	workerSpin = 50 * time.Microsecond
	// workerIdle is how long a blocked worker waits for another job before it ends: long
	// enough that the workers of a training step outlive its gaps (at 20 ms a tiny step
	// started ~28 goroutines again, three allocations each; at 200 ms about one).
	workerIdle = 200 * time.Millisecond
)

// parallelWorker runs j, then the jobs offered to it while it spins or handed to it while
// it is idle, and ends after workerIdle without one.
func parallelWorker(j *parallelJob) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.run(true)
		j.release()
		if j = spinForJob(); j != nil {
			continue
		}
		idle.Reset(workerIdle)
		select {
		case j = <-idleWorkers:
		case <-idle.C:
			return
		}
	}
}

// spinForJob polls offered for up to workerSpin and returns the job it took, or nil. The
// caller is already counted in spinningWorkers (by run); spinForJob takes it out.
func spinForJob() *parallelJob {
	defer spinningWorkers.Add(-1)
	deadline := time.Now().Add(workerSpin)
	for i := 1; ; i++ {
		if j := offered.Swap(nil); j != nil {
			return j
		}
		if i%16 == 0 && time.Now().After(deadline) { // reading the clock costs more than a poll
			return nil
		}
		runtime.Gosched()
	}
}

// workerPanic is a panic raised on one of parallelFor's goroutines, with that goroutine's
// stack.
type workerPanic struct {
	value any
	stack []byte
}

func (p *workerPanic) String() string {
	return fmt.Sprintf("%v\n[worker goroutine]\n%s", p.value, p.stack)
}

const (
	blkM = 32
	blkN = 64
	blkK = 256
)

// MatMulT computes C[M,N] = A[M,K] · B[N,K]ᵀ, or adds it to C when acc is true. B is
// row-major with rows of length K (the layout of a PyTorch Linear weight), so every output
// element is a dot product of two contiguous rows. Work is split into (row, column) blocks
// over goroutines; each element is always summed in the same order, so results do not
// depend on the number of threads.
func MatMulT[T Float](C, A, B []T, M, N, K int, acc bool) {
	if M == 0 || N == 0 {
		return
	}
	_ = A[M*K-1]
	_ = B[N*K-1]
	_ = C[M*N-1]
	if c, ok := any(C).([]float32); ok && activeKernel.fn != nil {
		sgemmNT(c, any(A).([]float32), any(B).([]float32), M, N, K, acc)
		return
	}
	mb := (M + blkM - 1) / blkM
	nb := (N + blkN - 1) / blkN
	parallelFor(mb*nb, M*N*K, func(idx int) {
		bi, bj := idx/nb, idx%nb
		i0, i1 := bi*blkM, min((bi+1)*blkM, M)
		j0, j1 := bj*blkN, min((bj+1)*blkN, N)
		matMulTBlock(C, A, B, N, K, i0, i1, j0, j1, acc)
	})
}

func matMulTBlock[T Float](C, A, B []T, N, K, i0, i1, j0, j1 int, acc bool) {
	i := i0
	for ; i+2 <= i1; i += 2 {
		a0 := A[i*K : i*K+K]
		a1 := A[(i+1)*K : (i+1)*K+K]
		c0 := C[i*N : i*N+N]
		c1 := C[(i+1)*N : (i+1)*N+N]
		j := j0
		for ; j+4 <= j1; j += 4 {
			b0 := B[j*K : j*K+K]
			b1 := B[(j+1)*K : (j+1)*K+K]
			b2 := B[(j+2)*K : (j+2)*K+K]
			b3 := B[(j+3)*K : (j+3)*K+K]
			var s00, s01, s02, s03, s10, s11, s12, s13 T
			a1 := a1[:len(a0)]
			b0 = b0[:len(a0)]
			b1 = b1[:len(a0)]
			b2 = b2[:len(a0)]
			b3 = b3[:len(a0)]
			for k, x0 := range a0 {
				x1 := a1[k]
				y0, y1, y2, y3 := b0[k], b1[k], b2[k], b3[k]
				s00 += x0 * y0
				s01 += x0 * y1
				s02 += x0 * y2
				s03 += x0 * y3
				s10 += x1 * y0
				s11 += x1 * y1
				s12 += x1 * y2
				s13 += x1 * y3
			}
			if acc {
				c0[j] += s00
				c0[j+1] += s01
				c0[j+2] += s02
				c0[j+3] += s03
				c1[j] += s10
				c1[j+1] += s11
				c1[j+2] += s12
				c1[j+3] += s13
			} else {
				c0[j], c0[j+1], c0[j+2], c0[j+3] = s00, s01, s02, s03
				c1[j], c1[j+1], c1[j+2], c1[j+3] = s10, s11, s12, s13
			}
		}
		for ; j < j1; j++ {
			b := B[j*K : j*K+K]
			s0, s1 := dot(a0, b), dot(a1, b)
			if acc {
				c0[j] += s0
				c1[j] += s1
			} else {
				c0[j], c1[j] = s0, s1
			}
		}
	}
	for ; i < i1; i++ {
		a := A[i*K : i*K+K]
		c := C[i*N : i*N+N]
		j := j0
		for ; j+4 <= j1; j += 4 {
			b0 := B[j*K : j*K+K][:len(a)]
			b1 := B[(j+1)*K : (j+1)*K+K][:len(a)]
			b2 := B[(j+2)*K : (j+2)*K+K][:len(a)]
			b3 := B[(j+3)*K : (j+3)*K+K][:len(a)]
			var s0, s1, s2, s3 T
			for k, x := range a {
				s0 += x * b0[k]
				s1 += x * b1[k]
				s2 += x * b2[k]
				s3 += x * b3[k]
			}
			if acc {
				c[j] += s0
				c[j+1] += s1
				c[j+2] += s2
				c[j+3] += s3
			} else {
				c[j], c[j+1], c[j+2], c[j+3] = s0, s1, s2, s3
			}
		}
		for ; j < j1; j++ {
			s := dot(a, B[j*K:j*K+K])
			if acc {
				c[j] += s
			} else {
				c[j] = s
			}
		}
	}
}

// dot returns Σ a[k]·b[k]. float32 slices use the vector kernel when the CPU has one
// (dotF32; 16-wide FMA accumulation), otherwise the sum runs in order.
func dot[T Float](a, b []T) T {
	if dotF32 != nil {
		if a32, ok := any(a).([]float32); ok {
			return T(dotF32(a32, any(b).([]float32)))
		}
	}
	b = b[:len(a)]
	var s T
	for k, x := range a {
		s += x * b[k]
	}
	return s
}

// MatMul computes C[M,N] = A[M,K] · B[K,N] (or adds to C when acc is true), with B
// row-major. It is used for input gradients (dX = dY·W). Rows of C are split over
// goroutines; columns are processed in cache-sized stripes.
func MatMul[T Float](C, A, B []T, M, N, K int, acc bool) {
	if M == 0 || N == 0 {
		return
	}
	_ = A[M*K-1]
	_ = B[K*N-1]
	_ = C[M*N-1]
	if c, ok := any(C).([]float32); ok && activeKernel.fn != nil {
		sgemmNN(c, any(A).([]float32), any(B).([]float32), M, N, K, acc)
		return
	}
	const stripe = 512
	mb := (M + 3) / 4
	ns := (N + stripe - 1) / stripe
	parallelFor(mb*ns, M*N*K, func(idx int) {
		bi, bs := idx/ns, idx%ns
		i0, i1 := bi*4, min(bi*4+4, M)
		j0, j1 := bs*stripe, min(bs*stripe+stripe, N)
		if !acc {
			for i := i0; i < i1; i++ {
				clear(C[i*N+j0 : i*N+j1])
			}
		}
		if i1-i0 == 4 {
			c0 := C[i0*N+j0 : i0*N+j1]
			c1 := C[(i0+1)*N+j0 : (i0+1)*N+j1][:len(c0)]
			c2 := C[(i0+2)*N+j0 : (i0+2)*N+j1][:len(c0)]
			c3 := C[(i0+3)*N+j0 : (i0+3)*N+j1][:len(c0)]
			for k := 0; k < K; k++ {
				x0, x1, x2, x3 := A[i0*K+k], A[(i0+1)*K+k], A[(i0+2)*K+k], A[(i0+3)*K+k]
				if x0 == 0 && x1 == 0 && x2 == 0 && x3 == 0 {
					continue
				}
				b := B[k*N+j0 : k*N+j1][:len(c0)]
				for j, y := range b {
					c0[j] += x0 * y
					c1[j] += x1 * y
					c2[j] += x2 * y
					c3[j] += x3 * y
				}
			}
			return
		}
		for i := i0; i < i1; i++ {
			c := C[i*N+j0 : i*N+j1]
			for k := 0; k < K; k++ {
				x := A[i*K+k]
				if x == 0 {
					continue
				}
				b := B[k*N+j0 : k*N+j1][:len(c)]
				for j, y := range b {
					c[j] += x * y
				}
			}
		}
	})
}

// MatMulTN adds A[K,M]ᵀ · B[K,N] to C[M,N]. It computes weight gradients (dW += dYᵀ·X).
// Rows of C are split over goroutines, so no two goroutines write the same element.
func MatMulTN[T Float](C, A, B []T, M, N, K int) {
	if M == 0 || N == 0 || K == 0 {
		return
	}
	_ = A[K*M-1]
	_ = B[K*N-1]
	_ = C[M*N-1]
	if c, ok := any(C).([]float32); ok && activeKernel.fn != nil {
		sgemmTN(c, any(A).([]float32), any(B).([]float32), M, N, K)
		return
	}
	parallelFor(M, M*N*K, func(i int) {
		c := C[i*N : i*N+N]
		for k := 0; k < K; k++ {
			x := A[k*M+i]
			if x == 0 {
				continue
			}
			b := B[k*N : k*N+N][:len(c)]
			for j, y := range b {
				c[j] += x * y
			}
		}
	})
}
