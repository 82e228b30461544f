package failover

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/lease/pglease"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The fenced-write test (issue 23, item 4) runs a leader in a process of its own (this test
// binary again, with fenceLeaderEnv set: runFenceLeader), so that it can be stopped with
// SIGSTOP as a long GC pause or a frozen VM stops one.

// fenceLeaderEnv holds the database URL of a leader process to run instead of the tests.
const fenceLeaderEnv = "LOOPS_TEST_FENCE_LEADER_DB"

// fenceTTL is the lease's TTL in the test: the stopped leader's lease lapses this long after
// its last renewal.
const fenceTTL = 2 * time.Second

// The records both leaders write: the old leader writes seq_id 1, 2, …, the new one newSeq.
const (
	fenceWS, fenceRun, fenceOp = "ws", "run-fenced", "op-fenced"
	newSeq                     = 1_000_000
)

func TestMain(m *testing.M) {
	if url := os.Getenv(fenceLeaderEnv); url != "" {
		os.Exit(runFenceLeader(url))
	}
	os.Exit(m.Run())
}

// fenceEvent is a line the leader process writes on stdout.
type fenceEvent struct {
	Event  string `json:"event"` // elected, committed, refused, lost
	Seq    int64  `json:"seq,omitempty"`
	Term   int64  `json:"term,omitempty"`
	Fenced bool   `json:"fenced,omitempty"`
	Error  string `json:"error,omitempty"`
}

// fenceBatch is a leader's group commit: the run's bookkeeping and the operation's outcome,
// both marked with seq.
func fenceBatch(seq int64) store.Batch {
	return store.Batch{
		TrainingRuns: []store.OwnedTrainingRun{{Workspace: fenceWS, Run: &loopsv1.TrainingRun{Id: fenceRun, LastSeqId: seq}}},
		Operations: []store.OwnedOperation{{Workspace: fenceWS, Operation: &loopsv1.Operation{
			Id: fenceOp, TrainingRunId: fenceRun, SeqId: seq, State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		}}},
	}
}

// runFenceLeader is the leader process: it takes the lease (holder "old"), fences its store
// with its term as a gateway does (lease.Elector.Fence), and commits batches one after
// another, each marked with the next seq_id. A batch it has begun is always sent, even when
// its lease is lost meanwhile (a write in flight); after a refused batch, or once the lease
// is lost, it exits with status 3.
func runFenceLeader(url string) int {
	ctx := context.Background()
	// The elector's goroutine reports "lost" while the loop reports its batches: one line at
	// a time (interleaved writes garbled a line, and the test stopped reading there).
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(e fenceEvent) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = enc.Encode(e)
	}
	fail := func(err error) int {
		emit(fenceEvent{Event: "error", Error: err.Error()})
		return 1
	}
	ls, err := pglease.Open(ctx, url, 0)
	if err != nil {
		return fail(err)
	}
	st, err := postgres.Open(ctx, url, postgres.Options{})
	if err != nil {
		return fail(err)
	}
	var lost atomic.Bool
	elected := make(chan lease.Record, 1)
	var el *lease.Elector
	el, err = lease.New(lease.Config{
		Store: ls, Holder: "old", Address: "http://old", TTL: fenceTTL,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, nil)),
		OnElected: func(rec lease.Record) { elected <- rec },
		OnLost: func(err error) {
			lost.Store(true)
			emit(fenceEvent{Event: "lost", Error: err.Error()})
		},
	})
	if err != nil {
		return fail(err)
	}
	go func() { _ = el.Run(ctx) }()
	rec := <-elected
	if err := st.SetFence(el.Fence(rec)); err != nil {
		return fail(err)
	}
	emit(fenceEvent{Event: "elected", Term: rec.Term})
	for seq := int64(1); ; seq++ {
		b := fenceBatch(seq)
		time.Sleep(5 * time.Millisecond)
		if err := st.ApplyBatch(ctx, b); err != nil {
			emit(fenceEvent{Event: "refused", Seq: seq, Fenced: errors.Is(err, store.ErrFenced), Error: err.Error()})
			return 3
		}
		emit(fenceEvent{Event: "committed", Seq: seq})
		if lost.Load() {
			return 3
		}
	}
}

// TestPausedLeaderIsFenced: the leader is stopped (SIGSTOP) past its lease while it commits
// batch after batch; the standby takes the lease over and writes the same records; then the
// old leader is resumed (SIGCONT) with its next batch in flight: the database refuses that
// batch (store.ErrFenced) and the records are the new leader's. Without the fence, the old
// leader's batch would overwrite them.
func TestPausedLeaderIsFenced(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := t.Context()
	url, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fenceLeaderEnv+"="+url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	events := make(chan fenceEvent, 1<<16)
	go func() {
		readEvents(stdout, events)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	})
	next := func(want string) fenceEvent {
		t.Helper()
		for {
			select {
			case e, ok := <-events:
				require.True(t, ok, "the leader process ended before %q", want)
				require.NotEqual(t, "error", e.Event, e.Error)
				if e.Event == want {
					return e
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the leader process did not report %q", want)
			}
		}
	}
	old := next("elected")
	for range 3 {
		next("committed")
	}

	// The leader stops with batches in flight; its lease lapses; the standby takes over.
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stoppedAt := time.Now()
	require.Eventually(t, func() bool { return processState(cmd.Process.Pid) == 'T' }, 5*time.Second, time.Millisecond)

	ls, err := pglease.Open(ctx, url, 0)
	require.NoError(t, err)
	defer ls.Close()
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	elected := make(chan lease.Record, 1)
	var el *lease.Elector
	el, err = lease.New(lease.Config{
		Store: ls, Holder: "new", Address: "http://new", TTL: fenceTTL, RetryEvery: 20 * time.Millisecond,
		OnElected: func(rec lease.Record) { elected <- rec },
		OnLost:    func(err error) { t.Errorf("the new leader lost the lease: %v", err) },
	})
	require.NoError(t, err)
	ectx, stop := context.WithCancel(ctx)
	elDone := make(chan struct{})
	go func() {
		defer close(elDone)
		_ = el.Run(ectx)
	}()
	defer func() { stop(); <-elDone }() // releases the lease before the pools close
	var rec lease.Record
	select {
	case rec = <-elected:
	case <-time.After(4 * fenceTTL):
		t.Fatal("the standby did not take the lease over from the stopped leader")
	}
	require.Equal(t, old.Term+1, rec.Term)
	require.Equal(t, "old", rec.Previous)
	require.NoError(t, st.SetFence(el.Fence(rec)))
	require.NoError(t, st.ApplyBatch(ctx, fenceBatch(newSeq)), "the new leader writes (a stopped leader's transaction holds no lock past its idle timeout)")
	took := time.Since(stoppedAt)
	require.Equal(t, byte('T'), processState(cmd.Process.Pid), "the old leader was stopped all along")

	// The old leader resumes with its next batch in flight.
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	var after []fenceEvent
	for e := range events { // until it exits
		after = append(after, e)
	}
	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the old leader did not exit")
	}

	// The records are the new leader's: the old leader's batch did not overwrite them.
	run, err := st.GetTrainingRun(ctx, fenceWS, fenceRun)
	require.NoError(t, err)
	require.EqualValues(t, newSeq, run.GetLastSeqId(), "the run's record is the new leader's")
	op, err := st.GetOperation(ctx, fenceWS, fenceOp)
	require.NoError(t, err)
	require.EqualValues(t, newSeq, op.GetSeqId(), "the operation's record is the new leader's")

	// Its batch was refused as fenced, and it stopped as having lost the lease.
	i := slices.IndexFunc(after, func(e fenceEvent) bool { return e.Event == "refused" })
	require.GreaterOrEqual(t, i, 0, "the old leader's batch was refused: it reported %+v", after)
	refused := after[i]
	require.True(t, refused.Fenced, "refused as store.ErrFenced: %s", refused.Error)
	var exit *exec.ExitError
	require.ErrorAs(t, exitErr, &exit)
	require.Equal(t, 3, exit.ExitCode())

	// The new leader goes on writing.
	require.NoError(t, st.ApplyBatch(ctx, fenceBatch(newSeq+1)))
	t.Logf("the standby took over and wrote %s after the stop; the old leader's batch %d, in flight, was refused: %s",
		took.Round(time.Millisecond), refused.Seq, refused.Error)
}

// readEvents decodes the leader's stdout lines into events until it ends.
func readEvents(r io.Reader, events chan<- fenceEvent) {
	defer close(events)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e fenceEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			events <- e
		}
	}
}

// processState is the state letter of process pid in /proc (T: stopped), 0 when unknown.
func processState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces, so read after its closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}
