package core

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/writebehind"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// failover runs a leader on dataDir dir1 whose store holds the commit of fb's outcome, lets
// a client wait for fb, then kills the leader and starts the gateway that takes over on
// another disk (dir2) on the same database. It returns whether the client saw fb finish
// before the kill, and fb as the new leader reports it.
func failover(t *testing.T, publishAfterCommit bool) (acked bool, after *loopsv1.Operation, h2 *harness, ackedEarlier *loopsv1.Operation) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	sq, err := sqlite.Open(t.Context(), filepath.Join(dir1, "loops.db"))
	require.NoError(t, err)
	st := &crashStore{Store: sq, entered: make(chan struct{}), release: make(chan struct{})}
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir1, GapTimeout: time.Hour, PublishAfterCommit: publishAfterCommit})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir1, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	fb1, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	ackedEarlier = h.wait(fb1)

	fake.gate = make(chan struct{})
	fb, err := h.fb(run, 2, datum(1, 2))
	require.NoError(t, err)
	st.mu.Lock()
	st.hold = fb.GetId()
	st.mu.Unlock()
	// Its creation reaches the database first, in a group of its own.
	require.Eventually(t, func() bool { _, err := sq.GetOperation(t.Context(), "ws-a", fb.GetId()); return err == nil }, 5*time.Second, time.Millisecond)
	close(fake.gate)
	<-st.entered // fb's outcome is decided; its commit to the database is under way
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: fb.GetId(), Timeout: durationpb.New(200 * time.Millisecond)})
	require.NoError(t, err)
	acked = isDone(got)

	// kill -9: nothing more reaches the database, and dir1 is on a disk the new leader
	// never sees.
	st.dead.Store(true)
	c.ops.persist.Crash()
	close(st.release)
	t.Cleanup(func() {
		_ = c.Close()
		_ = sq.Close()
	})

	sq2, err := sqlite.Open(t.Context(), filepath.Join(dir1, "loops.db"))
	require.NoError(t, err)
	fake2 := newFakeBackend()
	c2, err := New(t.Context(), sq2, fake2, Options{DataDir: dir2, TookOver: true, PublishAfterCommit: publishAfterCommit})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c2.Close()
		_ = sq2.Close()
	})
	h2 = &harness{t: t, dir: dir2, fake: fake2, core: c2, svc: c2.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	after, err = h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: fb.GetId()})
	require.NoError(t, err)
	return acked, after, h2, ackedEarlier
}

// TestFailoverLosesNoAcknowledgedOutcome: with PublishAfterCommit an outcome is shown to
// clients only once the database has it, so the gateway that takes over from a killed leader
// (on another disk) has every outcome a client saw; the one being committed at the kill was
// never shown and is failed with the failover message. No journal is written.
func TestFailoverLosesNoAcknowledgedOutcome(t *testing.T) {
	acked, after, h2, earlier := failover(t, true)
	require.False(t, acked, "an outcome whose commit has not returned is not shown")
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, after.GetState())
	require.Contains(t, after.GetError().GetMessage(), "the gateway failed over to a standby")
	_, err := h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: earlier.GetId()})
	requireExpired(t, err) // its large result was in the dead leader's memory, as after a restart
	got, err := h2.core.store.GetOperation(t.Context(), "ws-a", earlier.GetId())
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState())
	require.Equal(t, earlier.GetDoneTime().AsTime(), got.GetDoneTime().AsTime())
	_, err = os.Stat(filepath.Join(h2.dir, writebehind.JournalDir))
	require.ErrorIs(t, err, os.ErrNotExist, "no journal without one")
}

// TestFailoverWithJournalLosesAcknowledged shows why: with the journal, an outcome is shown
// once it is on the leader's disk, which the new leader cannot replay.
func TestFailoverWithJournalLosesAcknowledged(t *testing.T) {
	acked, after, _, _ := failover(t, false)
	require.True(t, acked, "shown once journaled")
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, after.GetState(), "and lost by the failover")
}

// TestRestartMessage: a plain restart says so.
func TestRestartMessage(t *testing.T) {
	require.Contains(t, unfinishedError(false).GetMessage(), "server restarted")
	require.Contains(t, unfinishedError(true).GetMessage(), "failed over")
}

// TestTakeoverFailsFirstStepOfARun: after a takeover, a run's adapter is recreated fresh;
// its first operation fails with the failover message naming the checkpoint to load, so a
// client never trains on silently from a reset adapter. A load_state goes through, and
// after the failure later steps run (on the run marked corrupted, as after a restart).
func TestTakeoverFailsFirstStepOfARun(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{PublishAfterCommit: true, GapTimeout: time.Hour})
	run, other := h.newRun(), h.newRun()
	h.wait(must(h.fb(run, 1, datum(1, 2))))
	saved := h.wait(must(h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 2, Name: "ck", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING})))
	path := saved.GetSaveWeights().GetPath()
	h.wait(must(h.fb(other, 1, datum(1, 2))))
	otherSaved := h.wait(must(h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: other, SeqId: 2, Name: "ck", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING})))
	require.NoError(t, h.core.Close())

	h2 := newHarness(t, dir, Options{PublishAfterCommit: true, TookOver: true, GapTimeout: time.Hour})
	got := h2.wait(must(h2.fb(run, 3, datum(1, 2))))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "failed over to a standby")
	require.Contains(t, got.GetError().GetMessage(), path)
	got = h2.wait(must(h2.fb(run, 4, datum(1, 2))))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())

	got = h2.wait(must(h2.svc.Training.LoadWeights(h2.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: other, SeqId: 3, Path: otherSaved.GetSaveWeights().GetPath()})))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
	got = h2.wait(must(h2.fb(other, 4, datum(1, 2))))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
