package audit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
)

// memStore is an AuditStore in memory whose appends can be made to fail or to block.
type memStore struct {
	mu      sync.Mutex
	events  []store.OwnedAuditEvent
	batches []int
	fail    bool
	block   chan struct{} // when set, appends wait for it to close
}

func (m *memStore) AppendAuditEvents(ctx context.Context, evs []store.OwnedAuditEvent) error {
	m.mu.Lock()
	block, fail := m.block, m.fail
	m.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail {
		return errors.New("database down")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, evs...)
	m.batches = append(m.batches, len(evs))
	return nil
}

func (m *memStore) ListAuditEvents(context.Context, string, store.AuditQuery) ([]store.AuditEvent, error) {
	return nil, nil
}
func (m *memStore) DeleteAuditEventsBefore(context.Context, time.Time) (int, error) { return 0, nil }
func (m *memStore) TrimAuditEvents(context.Context, int) (int, error)               { return 0, nil }

func (m *memStore) set(fail bool, block chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail, m.block = fail, block
}

func (m *memStore) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.events)
}

func ev(target string) store.AuditEvent {
	return store.AuditEvent{Time: time.Unix(1, 0), KeyID: "key-1", Event: "session_create", Target: target}
}

// TestRecorderBatchesAndFlushes: events recorded are written in batches, in order; Flush
// returns once what was recorded before it is written; a released slot writes nothing.
func TestRecorderBatchesAndFlushes(t *testing.T) {
	st := &memStore{}
	r := NewRecorder(st, Options{Buffer: 64, Batch: 4, FlushEvery: time.Hour})
	r.Start()
	defer r.Close()
	for i := range 10 {
		s, err := r.Admit(t.Context())
		require.NoError(t, err)
		if i == 5 {
			s.Release()
			continue
		}
		s.Record("ws", ev(string(rune('a'+i))))
	}
	require.NoError(t, r.Flush(t.Context()))
	require.Equal(t, 9, st.count())
	var got string
	for _, e := range st.events {
		got += e.Event.Target
	}
	require.Equal(t, "abcdeghij", got)
	for _, n := range st.batches {
		require.LessOrEqual(t, n, 4)
	}
	require.Zero(t, len(r.slot), "every slot is given back once written")
}

// TestRecorderFullRefuses: while the store is slow the buffer fills, and a call that finds
// no room within AdmitWait is refused (ErrFull, counted), never dropped; once the store
// catches up the events are written and calls are admitted again.
func TestRecorderFullRefuses(t *testing.T) {
	st := &memStore{}
	block := make(chan struct{})
	st.set(false, block)
	reg := prometheus.NewRegistry()
	r := NewRecorder(st, Options{Buffer: 3, Batch: 2, FlushEvery: time.Millisecond, AdmitWait: 20 * time.Millisecond, Registerer: reg})
	r.Start()
	defer r.Close()
	for i := range 3 {
		s, err := r.Admit(t.Context())
		require.NoError(t, err, "event %d", i)
		s.Record("ws", ev("x"))
	}
	_, err := r.Admit(t.Context())
	require.ErrorIs(t, err, ErrFull)
	require.Equal(t, 1.0, testutil.ToFloat64(r.mx.refused))

	close(block)
	require.NoError(t, r.Flush(t.Context()))
	require.Equal(t, 3, st.count())
	s, err := r.Admit(t.Context())
	require.NoError(t, err)
	s.Release()
}

// TestRecorderRetriesFailedWrites: a failing store is retried with the events kept; they
// are written once it recovers.
func TestRecorderRetriesFailedWrites(t *testing.T) {
	st := &memStore{}
	st.set(true, nil)
	r := NewRecorder(st, Options{Buffer: 8, FlushEvery: time.Millisecond})
	r.Start()
	defer r.Close()
	s, err := r.Admit(t.Context())
	require.NoError(t, err)
	s.Record("ws", ev("kept"))
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.mx.failures) >= 2 }, 5*time.Second, time.Millisecond)
	require.Zero(t, st.count())
	st.set(false, nil)
	require.NoError(t, r.Flush(t.Context()))
	require.Equal(t, "kept", st.events[0].Event.Target)
}

// TestRecorderCloseWritesBuffered: Close waits for admitted calls to record and writes
// everything buffered; after Close calls are refused with ErrClosed.
func TestRecorderCloseWritesBuffered(t *testing.T) {
	st := &memStore{}
	r := NewRecorder(st, Options{Buffer: 100, Batch: 10, FlushEvery: time.Hour})
	r.Start()
	for range 25 {
		s, err := r.Admit(t.Context())
		require.NoError(t, err)
		s.Record("ws", ev("x"))
	}
	late, err := r.Admit(t.Context())
	require.NoError(t, err)
	go func() {
		time.Sleep(20 * time.Millisecond)
		late.Record("ws", ev("late")) // a call still running when Close starts
	}()
	require.NoError(t, r.Close())
	require.Equal(t, 26, st.count())
	require.Zero(t, testutil.ToFloat64(r.mx.lost))
	_, err = r.Admit(t.Context())
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, r.Close())
}

// TestRecorderCloseCountsLost: a store that never answers loses the buffered events at
// Close's end, counted and logged, instead of hanging the shutdown.
func TestRecorderCloseCountsLost(t *testing.T) {
	st := &memStore{}
	st.set(true, nil)
	r := NewRecorder(st, Options{Buffer: 8, FlushEvery: time.Millisecond})
	r.closeWait = 200 * time.Millisecond
	r.Start()
	for range 3 {
		s, err := r.Admit(t.Context())
		require.NoError(t, err)
		s.Record("ws", ev("x"))
	}
	start := time.Now()
	require.NoError(t, r.Close())
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, 3.0, testutil.ToFloat64(r.mx.lost))
}
