// Command storebench measures the metadata stores side by side, in one run: SQLite (a file
// in a temporary folder) and PostgreSQL (a throwaway local cluster that it starts, or the
// server at -database). For each store and each operation it runs -n calls from -workers
// goroutines and prints calls per second and the p50 and p99 latency of one call:
//
//   - create run: PutTrainingRun of a new run;
//   - put operation batch: ApplyBatch of -batch new operations (the core's write-behind
//     group commit);
//   - list: ListTrainingRuns, first page of 100, in a workspace of -rows runs;
//   - list deep (offset): the page of 100 at offset -rows/2;
//   - list deep (keyset): the same page through Page.After.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

type result struct {
	Store   string  `json:"store"`
	Op      string  `json:"op"`
	Calls   int     `json:"calls"`
	Workers int     `json:"workers"`
	PerSec  float64 `json:"calls_per_s"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
}

type config struct {
	n, workers, batch, rows int
}

func main() {
	var cfg config
	database := flag.String("database", "", "PostgreSQL URL to measure (default: start a throwaway local cluster)")
	flag.IntVar(&cfg.n, "n", 2000, "calls per operation and store")
	flag.IntVar(&cfg.workers, "workers", 8, "goroutines calling at once")
	flag.IntVar(&cfg.batch, "batch", 64, "operations per ApplyBatch")
	flag.IntVar(&cfg.rows, "rows", 10000, "training runs in the listed workspace")
	durable := flag.Bool("durable", false, "throwaway cluster: fsync and synchronous_commit on (each commit waits for its WAL flush; SQLite's synchronous=NORMAL does not)")
	asJSON := flag.Bool("json", false, "print JSON instead of a table")
	flag.Parse()
	if err := run(context.Background(), cfg, *database, *durable, *asJSON); err != nil {
		slog.Error("storebench", slog.Any("err", err))
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, database string, durable, asJSON bool) error {
	dir, err := os.MkdirTemp("", "storebench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pgNote := database
	if database == "" {
		var settings []string
		pgNote = "throwaway local cluster (fsync=off, synchronous_commit=off)"
		if durable {
			settings = []string{"fsync=on", "synchronous_commit=on", "full_page_writes=on"}
			pgNote = "throwaway local cluster (fsync=on, synchronous_commit=on)"
		}
		srv, err := pgtest.Launch(settings)
		if err != nil {
			return fmt.Errorf("start PostgreSQL (or pass -database): %w", err)
		}
		defer srv.Stop()
		if database, err = srv.CreateDatabase(ctx); err != nil {
			return err
		}
	}

	stores := []struct {
		name string
		open func() (store.Store, error)
	}{
		{"sqlite", func() (store.Store, error) { return sqlite.Open(ctx, filepath.Join(dir, "loops.db")) }},
		{"postgres", func() (store.Store, error) {
			return postgres.Open(ctx, database, postgres.Options{MaxConns: max(cfg.workers, 4)})
		}},
	}
	var results []result
	for _, s := range stores {
		st, err := s.open()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		rs, err := measure(ctx, st, s.name, cfg)
		_ = st.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		results = append(results, rs...)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	fmt.Printf("%d calls per row, %d workers, batches of %d operations (%d B each), lists over %d runs; GOMAXPROCS %d\n",
		cfg.n, cfg.workers, cfg.batch, proto.Size(operation("op-0000000", 0)), cfg.rows, runtime.GOMAXPROCS(0))
	fmt.Printf("sqlite: file in %s; postgres: %s\n\n", os.TempDir(), postgres.Redact(pgNote))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "| operation\t| sqlite calls/s\t| p50 ms\t| p99 ms\t| postgres calls/s\t| p50 ms\t| p99 ms\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	half := len(results) / 2
	for i := range half {
		a, b := results[i], results[half+i]
		fmt.Fprintf(tw, "| %s\t| %.0f\t| %.2f\t| %.2f\t| %.0f\t| %.2f\t| %.2f\t|\n",
			a.Op, a.PerSec, a.P50ms, a.P99ms, b.PerSec, b.P50ms, b.P99ms)
	}
	return tw.Flush()
}

// measure runs every operation against st.
func measure(ctx context.Context, st store.Store, name string, cfg config) ([]result, error) {
	var out []result
	add := func(op string, fn func(i int) error) error {
		r, err := timeCalls(cfg, fn)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		r.Store, r.Op = name, op
		out = append(out, r)
		return nil
	}

	if err := add("create run", func(i int) error {
		return st.PutTrainingRun(ctx, "ws-create", trainingRun(fmt.Sprintf("run-%07d", i), i))
	}); err != nil {
		return nil, err
	}

	if err := add(fmt.Sprintf("put operation batch (%d)", cfg.batch), func(i int) error {
		b := store.Batch{}
		for k := range cfg.batch {
			id := i*cfg.batch + k
			b.Operations = append(b.Operations, store.OwnedOperation{Workspace: "ws-ops", Operation: operation(fmt.Sprintf("op-%07d", id), id)})
		}
		return st.ApplyBatch(ctx, b)
	}); err != nil {
		return nil, err
	}

	// The listed workspace, written in batches.
	for i := 0; i < cfg.rows; i += 500 {
		var b store.Batch
		for k := i; k < min(i+500, cfg.rows); k++ {
			b.TrainingRuns = append(b.TrainingRuns, store.OwnedTrainingRun{Workspace: "ws-list", Run: trainingRun(fmt.Sprintf("lrun-%07d", k), k)})
		}
		if err := st.ApplyBatch(ctx, b); err != nil {
			return nil, err
		}
	}
	list := func(page store.Page) error {
		l, total, err := st.ListTrainingRuns(ctx, "ws-list", page)
		if err == nil && (len(l) != 100 || total != int64(cfg.rows)) {
			err = fmt.Errorf("listed %d of %d", len(l), total)
		}
		return err
	}
	if err := add("list (first 100)", func(int) error { return list(store.Page{Limit: 100}) }); err != nil {
		return nil, err
	}
	if err := add("list deep, offset", func(int) error { return list(store.Page{Limit: 100, Offset: cfg.rows / 2}) }); err != nil {
		return nil, err
	}
	prev, _, err := st.ListTrainingRuns(ctx, "ws-list", store.Page{Limit: 1, Offset: cfg.rows/2 - 1})
	if err != nil || len(prev) != 1 {
		return nil, fmt.Errorf("cursor: %v", err)
	}
	after := store.CursorOf(prev[0])
	if err := add("list deep, keyset", func(int) error { return list(store.Page{Limit: 100, After: after}) }); err != nil {
		return nil, err
	}
	return out, nil
}

// timeCalls runs fn(0..n-1) from cfg.workers goroutines and summarizes the latencies.
func timeCalls(cfg config, fn func(i int) error) (result, error) {
	lat := make([]time.Duration, cfg.n)
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.n {
					return
				}
				t := time.Now()
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				lat[i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if firstErr != nil {
		return result{}, firstErr
	}
	slices.Sort(lat)
	ms := func(q float64) float64 {
		return float64(lat[min(int(q*float64(len(lat))), len(lat)-1)]) / float64(time.Millisecond)
	}
	return result{Calls: cfg.n, Workers: cfg.workers, PerSec: float64(cfg.n) / wall.Seconds(), P50ms: ms(0.50), P99ms: ms(0.99)}, nil
}

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func trainingRun(id string, i int) *loopsv1.TrainingRun {
	return &loopsv1.TrainingRun{
		Id:           id,
		SessionId:    "sess-bench",
		BaseModel:    "Qwen/Qwen3-8B",
		Lora:         &loopsv1.LoraConfig{Rank: 32, TrainMlp: true, TrainAttn: true},
		UserMetadata: map[string]string{"experiment": "storebench"},
		CreateTime:   timestamppb.New(base.Add(time.Duration(i) * time.Millisecond)),
		LastSeqId:    int64(i),
	}
}

func operation(id string, i int) *loopsv1.Operation {
	return &loopsv1.Operation{
		Id:            id,
		Kind:          loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS,
		State:         loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		TrainingRunId: "run-bench",
		SeqId:         int64(i),
		CreateTime:    timestamppb.New(base.Add(time.Duration(i) * time.Millisecond)),
		DoneTime:      timestamppb.New(base.Add(time.Duration(i)*time.Millisecond + time.Second)),
		Result: &loopsv1.Operation_SaveWeights{SaveWeights: &loopsv1.SaveWeightsResult{
			Path: "tinker://run-bench/weights/" + id,
		}},
	}
}
