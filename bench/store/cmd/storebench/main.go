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
//
// Then it measures what the fence costs (store.Fencer: the store of a leader among gateways
// that share the database checks the leader lease's term inside the transaction of every
// write): a plain and a fenced PostgreSQL store on the same database take the same writes
// in alternating blocks of 50 calls, so that the machine's load weighs on both alike, and it
// prints the p50 and mean latency of each and the fenced one's over the plain one's.
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

	"github.com/loops-dev/loops/gateway/lease/pglease"
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

// fenceRow is what the fence costs one kind of write.
type fenceRow struct {
	Op           string  `json:"op"`
	Calls        int     `json:"calls"`
	PlainP50ms   float64 `json:"plain_p50_ms"`
	FencedP50ms  float64 `json:"fenced_p50_ms"`
	PlainMeanms  float64 `json:"plain_mean_ms"`
	FencedMeanms float64 `json:"fenced_mean_ms"`
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
	fence, err := fenceCost(ctx, database, cfg)
	if err != nil {
		return fmt.Errorf("fence cost: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Results []result   `json:"results"`
			Fence   []fenceRow `json:"fence"`
		}{results, fence})
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
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Printf("\nThe fence (PostgreSQL, one worker, alternating blocks of %d calls, %d calls each):\n\n", fenceBlock, fence[0].Calls)
	fmt.Fprintln(tw, "| write\t| plain p50 ms\t| fenced p50 ms\t| fenced ÷ plain\t| plain mean ms\t| fenced mean ms\t| fenced ÷ plain\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range fence {
		fmt.Fprintf(tw, "| %s\t| %.3f\t| %.3f\t| %.2f\t| %.3f\t| %.3f\t| %.2f\t|\n", r.Op, r.PlainP50ms, r.FencedP50ms,
			r.FencedP50ms/r.PlainP50ms, r.PlainMeanms, r.FencedMeanms, r.FencedMeanms/r.PlainMeanms)
	}
	return tw.Flush()
}

// fenceBlock is how many calls go to one store before the other's turn in fenceCost.
const fenceBlock = 50

// fenceCost measures the fence on the writes of a gateway: a plain store and a fenced one
// (holding the database's leader lease) take the same kinds of writes, in blocks of
// fenceBlock calls that alternate between the two (the one that goes first too), about
// cfg.n calls each.
func fenceCost(ctx context.Context, database string, cfg config) ([]fenceRow, error) {
	plain, err := postgres.Open(ctx, database, postgres.Options{MaxConns: 4})
	if err != nil {
		return nil, err
	}
	defer plain.Close()
	fenced, err := postgres.Open(ctx, database, postgres.Options{MaxConns: 4})
	if err != nil {
		return nil, err
	}
	defer fenced.Close()
	f, release, err := takeLease(ctx, database)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := fenced.SetFence(f); err != nil {
		return nil, err
	}
	writes := []struct {
		name string
		fn   func(st store.Store, prefix string, i int) error
	}{
		{"create run (one row)", func(st store.Store, prefix string, i int) error {
			return st.PutTrainingRun(ctx, prefix+"ws", trainingRun(fmt.Sprintf("%sfrun-%07d", prefix, i), i))
		}},
		{"batch of one step (a run and an operation)", func(st store.Store, prefix string, i int) error {
			run := trainingRun(prefix+"step-run", 0)
			run.LastSeqId = int64(i)
			return st.ApplyBatch(ctx, store.Batch{
				TrainingRuns: []store.OwnedTrainingRun{{Workspace: prefix + "ws", Run: run}},
				Operations:   []store.OwnedOperation{{Workspace: prefix + "ws", Operation: operation(fmt.Sprintf("%sstep-op-%07d", prefix, i), i)}},
			})
		}},
		{fmt.Sprintf("put operation batch (%d)", cfg.batch), func(st store.Store, prefix string, i int) error {
			b := store.Batch{}
			for k := range cfg.batch {
				id := i*cfg.batch + k
				b.Operations = append(b.Operations, store.OwnedOperation{Workspace: prefix + "ws", Operation: operation(fmt.Sprintf("%sfop-%07d", prefix, id), id)})
			}
			return st.ApplyBatch(ctx, b)
		}},
	}
	var rows []fenceRow
	blocks := max(cfg.n/fenceBlock, 1)
	for _, w := range writes {
		var lat [2][]time.Duration
		sides := [2]struct {
			st     store.Store
			prefix string
		}{{plain, "plain-"}, {fenced, "fenced-"}}
		for b := range blocks {
			for k := range 2 {
				side := (b + k) % 2 // who goes first alternates too
				for c := range fenceBlock {
					t := time.Now()
					if err := w.fn(sides[side].st, sides[side].prefix, b*fenceBlock+c); err != nil {
						return nil, fmt.Errorf("%s: %w", w.name, err)
					}
					lat[side] = append(lat[side], time.Since(t))
				}
			}
		}
		rows = append(rows, fenceRow{Op: w.name, Calls: len(lat[0]),
			PlainP50ms: quantileMs(lat[0], 0.5), FencedP50ms: quantileMs(lat[1], 0.5),
			PlainMeanms: meanMs(lat[0]), FencedMeanms: meanMs(lat[1])})
	}
	return rows, nil
}

// takeLease takes a lease of this process's own in the database (not the gateways' lease,
// which a -database that gateways use holds) and returns the fence of its term, and what
// releases it.
func takeLease(ctx context.Context, database string) (store.Fence, func(), error) {
	ls, err := pglease.Open(ctx, database, 0)
	if err != nil {
		return store.Fence{}, nil, err
	}
	name, holder := fmt.Sprintf("storebench-%d", os.Getpid()), "storebench"
	rec, ok, err := ls.TryAcquire(ctx, name, holder, "http://storebench", time.Hour)
	if err == nil && !ok {
		err = fmt.Errorf("the lease %s is held by %s", name, rec.Holder)
	}
	if err != nil {
		ls.Close()
		return store.Fence{}, nil, err
	}
	release := func() {
		_ = ls.Release(context.WithoutCancel(ctx), name, holder, rec.Term)
		ls.Close()
	}
	return store.Fence{Lease: name, Holder: holder, Term: rec.Term, IdleTimeout: 5 * time.Second}, release, nil
}

// quantileMs is the q-quantile of lat, in milliseconds (lat is sorted).
func quantileMs(lat []time.Duration, q float64) float64 {
	slices.Sort(lat)
	return float64(lat[min(int(q*float64(len(lat))), len(lat)-1)]) / float64(time.Millisecond)
}

func meanMs(lat []time.Duration) float64 {
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return float64(sum) / float64(len(lat)) / float64(time.Millisecond)
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
