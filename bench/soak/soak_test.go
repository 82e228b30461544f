package soak

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/bench/benchdata"
	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// sample is one observation after `sessions` sessions.
type sample struct {
	sessions   int
	elapsed    time.Duration
	rss, heap  int64
	goroutines int
}

// vmRSS reads the process's resident set size from /proc/self/status.
func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func observe(n int, start time.Time) sample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return sample{sessions: n, elapsed: time.Since(start), rss: vmRSS(), heap: int64(ms.HeapAlloc), goroutines: runtime.NumGoroutine()}
}

// slope is the least-squares slope of y over x.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// writeHeapProfile writes the live heap to path+suffix, if path is set: the profiles at
// the end of warm-up (".warm") and at the end, compared with `go tool pprof -base`, show
// what grew.
func writeHeapProfile(t *testing.T, path, suffix string) {
	if path == "" {
		return
	}
	f, err := os.Create(path + suffix)
	require.NoError(t, err)
	runtime.GC()
	require.NoError(t, pprof.WriteHeapProfile(f))
	require.NoError(t, f.Close())
}

func datum(n int) *loopsv1.Datum { return benchdata.Datum(n) }

type clients struct {
	sessions loopsv1connect.SessionServiceClient
	training loopsv1connect.TrainingServiceClient
	ops      loopsv1connect.OperationServiceClient
}

// wait long-polls an operation until it is done and fails on an operation error.
func (c clients) wait(ctx context.Context, op *loopsv1.Operation) error {
	for {
		got, err := c.ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(20 * time.Second)})
		if err != nil {
			return err
		}
		switch got.GetState() {
		case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
			return nil
		case loopsv1.OperationState_OPERATION_STATE_FAILED:
			return fmt.Errorf("operation %s (%s) failed: %s", got.GetId(), got.GetKind(), got.GetError().GetMessage())
		}
	}
}

// oneSession is a short session: create, a run, 2 forward_backward + optim_step, save
// sampler weights, finish.
func (c clients) oneSession(ctx context.Context) error {
	sess, err := c.sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{Tags: []string{"soak"}})
	if err != nil {
		return err
	}
	seq := int64(0)
	op, err := c.training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		SessionId: sess.GetId(), ClientSeqId: &seq, BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true},
	})
	if err != nil {
		return err
	}
	if err := c.wait(ctx, op); err != nil {
		return err
	}
	run := op.GetTrainingRunId()
	var last *loopsv1.Operation
	for i := range int64(2) {
		if _, err := c.training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: i + 1, Data: []*loopsv1.Datum{datum(8)}, LossFn: "cross_entropy"}); err != nil {
			return err
		}
	}
	if last, err = c.training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 3, Adam: &loopsv1.AdamParams{LearningRate: 1e-3}}); err != nil {
		return err
	}
	if err := c.wait(ctx, last); err != nil {
		return err
	}
	if last, err = c.training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 4, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}); err != nil {
		return err
	}
	if err := c.wait(ctx, last); err != nil {
		return err
	}
	_, err = c.sessions.FinishSession(ctx, &loopsv1.FinishSessionRequest{Id: sess.GetId(), Reason: "soak"})
	return err
}

// TestSoak runs LOOPS_SOAK_SESSIONS (default 10,000) short sessions, LOOPS_SOAK_WORKERS
// (default 4) at a time, and reports RSS, live heap and goroutines every
// LOOPS_SOAK_EVERY (default 250) sessions, with their slope after the first
// LOOPS_SOAK_WARMUP (default 20%) sessions. LOOPS_SOAK_HEAPPROFILE=path writes heap
// profiles at the end of warm-up (path.warm) and at the end (path).
func TestSoak(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the soak benchmark")
	}
	total := envInt("LOOPS_SOAK_SESSIONS", 10000)
	workers := envInt("LOOPS_SOAK_WORKERS", 4)
	every := envInt("LOOPS_SOAK_EVERY", 250)
	warmup := envInt("LOOPS_SOAK_WARMUP", total/5)
	ctx := t.Context()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: dir, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	defer srv.Close(context.Background())
	url := "http://" + ln.Addr().String()
	key := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", "tml-soak")
			return next(ctx, req)
		}
	}))
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	c := clients{
		sessions: loopsv1connect.NewSessionServiceClient(hc, url, key),
		training: loopsv1connect.NewTrainingServiceClient(hc, url, key),
		ops:      loopsv1connect.NewOperationServiceClient(hc, url, key),
	}

	start := time.Now()
	samples := []sample{observe(0, start)}
	t.Logf("%6s %8s %10s %10s %10s", "sessions", "elapsed", "rss_MiB", "heap_MiB", "goroutines")
	logSample := func(s sample) {
		t.Logf("%6d %8s %10.1f %10.1f %10d", s.sessions, s.elapsed.Round(time.Second), float64(s.rss)/(1<<20), float64(s.heap)/(1<<20), s.goroutines)
	}
	logSample(samples[0])
	var next, done atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				if err := c.oneSession(ctx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				if n := done.Add(1); n%int64(every) == 0 {
					if int(n) == warmup {
						writeHeapProfile(t, os.Getenv("LOOPS_SOAK_HEAPPROFILE"), ".warm")
					}
					s := observe(int(n), start)
					mu.Lock()
					samples = append(samples, s)
					mu.Unlock()
					logSample(s)
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, firstErr)

	var xs, rss, heap, gor []float64
	for _, s := range samples {
		if s.sessions >= warmup {
			xs = append(xs, float64(s.sessions)/1000)
			rss = append(rss, float64(s.rss))
			heap = append(heap, float64(s.heap))
			gor = append(gor, float64(s.goroutines))
		}
	}
	last := samples[len(samples)-1]
	t.Logf("%d sessions, %d at a time, in %s (%.1f sessions/s)", done.Load(), workers, last.elapsed.Round(time.Second), float64(done.Load())/last.elapsed.Seconds())
	t.Logf("after warm-up (%d sessions, %d samples): RSS slope %+.2f MiB per 1000 sessions, live heap slope %+.2f MiB per 1000 sessions, goroutines slope %+.2f per 1000 sessions",
		warmup, len(xs), slope(xs, rss)/(1<<20), slope(xs, heap)/(1<<20), slope(xs, gor))
	writeHeapProfile(t, os.Getenv("LOOPS_SOAK_HEAPPROFILE"), "")
	t.Logf("final: RSS %.1f MiB, live heap %.1f MiB, %d goroutines; data dir %.1f MiB on disk (checkpoints and the database grow by design)",
		float64(last.rss)/(1<<20), float64(last.heap)/(1<<20), last.goroutines, float64(dirSize(dir))/(1<<20))
}
