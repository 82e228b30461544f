package pglease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/lease/pglease"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T) (*pglease.Store, string) {
	t.Helper()
	url := pgtest.Start(t).NewSchema(t)
	s, err := pglease.Open(context.Background(), url, 0)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, url
}

func TestTakeRenewRelease(t *testing.T) {
	s, url := open(t)
	ctx := context.Background()
	_, err := s.Get(ctx, "g")
	require.ErrorIs(t, err, lease.ErrNone)

	a, ok, err := s.TryAcquire(ctx, "g", "A", "http://a", 5*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(1), a.Term)
	require.Empty(t, a.Previous, "nobody held it before")
	require.Equal(t, 5*time.Second, a.ExpiresAt.Sub(a.RenewedAt))

	// A second gateway (its own pool, as another process has) cannot take a live lease,
	// and learns who holds it and where.
	s2, err := pglease.Open(ctx, url, 0)
	require.NoError(t, err)
	defer s2.Close()
	b, ok, err := s2.TryAcquire(ctx, "g", "B", "http://b", 5*time.Second)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, "A", b.Holder)
	require.Equal(t, "http://a", b.Address)
	require.True(t, b.Live())

	r, err := s.Renew(ctx, "g", "A", 1, 5*time.Second)
	require.NoError(t, err)
	require.True(t, r.ExpiresAt.After(a.ExpiresAt))
	_, err = s2.Renew(ctx, "g", "B", 1, 5*time.Second)
	require.ErrorIs(t, err, lease.ErrLost, "only the holder renews")
	_, err = s.Renew(ctx, "g", "A", 2, 5*time.Second)
	require.ErrorIs(t, err, lease.ErrLost, "a term that never was is not renewed")

	require.NoError(t, s2.Release(ctx, "g", "B", 1), "releasing a lease not held does nothing")
	_, ok, err = s2.TryAcquire(ctx, "g", "B", "http://b", 5*time.Second)
	require.NoError(t, err)
	require.False(t, ok)

	require.NoError(t, s.Release(ctx, "g", "A", 1))
	b, ok, err = s2.TryAcquire(ctx, "g", "B", "http://b", 5*time.Second)
	require.NoError(t, err)
	require.True(t, ok, "a released lease is taken at once")
	require.Equal(t, int64(2), b.Term)
	require.Equal(t, "A", b.Previous)
	require.False(t, b.PreviousExpiresAt.After(b.AcquiredAt))

	_, err = s.Renew(ctx, "g", "A", 1, 5*time.Second)
	require.ErrorIs(t, err, lease.ErrLost, "the old holder's term is over")
	got, err := s.Get(ctx, "g")
	require.NoError(t, err)
	require.Equal(t, "B", got.Holder)

	// Leases of other names are independent.
	_, ok, err = s.TryAcquire(ctx, "other", "A", "http://a", time.Second)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestExpiryOnTheDatabaseClock: a lease lapses exactly TTL after its last renewal on the
// database's clock; until then nobody takes it, after it the holder cannot renew it (it
// must take it again, with a new term) and another gateway can take it.
func TestExpiryOnTheDatabaseClock(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	const ttl = 400 * time.Millisecond
	a, ok, err := s.TryAcquire(ctx, "g", "A", "http://a", ttl)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, ttl, a.ExpiresAt.Sub(a.AcquiredAt), "sub-second TTLs are kept exactly")
	for {
		b, ok, err := s.TryAcquire(ctx, "g", "B", "http://b", ttl)
		require.NoError(t, err)
		if ok {
			require.False(t, b.AcquiredAt.Before(a.ExpiresAt), "taken before it lapsed on the database's clock")
			require.Equal(t, "A", b.Previous)
			require.Equal(t, a.ExpiresAt, b.PreviousExpiresAt)
			break
		}
		require.True(t, b.Now.Before(a.ExpiresAt), "not taken although lapsed")
		time.Sleep(20 * time.Millisecond)
	}
	_, err = s.Renew(ctx, "g", "A", a.Term, ttl)
	require.ErrorIs(t, err, lease.ErrLost)

	// A lapsed lease that nobody took is not renewed either: its holder may have stepped
	// down already.
	c, ok, err := s.TryAcquire(ctx, "h", "C", "http://c", 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(100 * time.Millisecond)
	_, err = s.Renew(ctx, "h", "C", c.Term, time.Second)
	require.ErrorIs(t, err, lease.ErrLost)
	c2, ok, err := s.TryAcquire(ctx, "h", "C", "http://c", time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c.Term+1, c2.Term)
}

// TestOneWinnerAmongContenders: gateways taking a fresh lease at once: exactly one gets it.
func TestOneWinnerAmongContenders(t *testing.T) {
	s, url := open(t)
	_ = s
	var wg sync.WaitGroup
	var wins atomic.Int32
	for i := range 6 {
		st, err := pglease.Open(context.Background(), url, 0)
		require.NoError(t, err)
		defer st.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := st.TryAcquire(context.Background(), "g", string(rune('A'+i)), "http://x", 5*time.Second)
			if err == nil && ok {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), wins.Load())
}

// flaky wraps a store: while down, every call waits for its context and fails, as a
// network partition from the database (or a killed process's pool) would.
type flaky struct {
	lease.Store
	down atomic.Bool
}

var errDown = errors.New("test: the database cannot be reached")

func (f *flaky) TryAcquire(ctx context.Context, name, holder, address string, ttl time.Duration) (lease.Record, bool, error) {
	if f.down.Load() {
		<-ctx.Done()
		return lease.Record{}, false, errDown
	}
	return f.Store.TryAcquire(ctx, name, holder, address, ttl)
}

func (f *flaky) Renew(ctx context.Context, name, holder string, term int64, ttl time.Duration) (lease.Record, error) {
	if f.down.Load() {
		<-ctx.Done()
		return lease.Record{}, errDown
	}
	return f.Store.Renew(ctx, name, holder, term, ttl)
}

func (f *flaky) Release(ctx context.Context, name, holder string, term int64) error {
	if f.down.Load() {
		return errDown
	}
	return f.Store.Release(ctx, name, holder, term)
}

type events struct {
	mu      sync.Mutex
	elected map[string]time.Time
	lost    map[string]time.Time
	// live is whether the database still held the lease when each holder stepped down.
	live map[string]bool
	ch   chan string
}

func newEvents() *events {
	return &events{elected: map[string]time.Time{}, lost: map[string]time.Time{}, live: map[string]bool{}, ch: make(chan string, 16)}
}

func elector(t *testing.T, st lease.Store, check lease.Store, holder string, ev *events, ttl time.Duration) *lease.Elector {
	t.Helper()
	e, err := lease.New(lease.Config{
		Store: st, Holder: holder, Address: "http://" + holder, TTL: ttl, RetryEvery: 20 * time.Millisecond,
		OnElected: func(lease.Record) {
			ev.mu.Lock()
			ev.elected[holder] = time.Now()
			ev.mu.Unlock()
			ev.ch <- "elected " + holder
		},
		OnLost: func(error) {
			r, err := check.Get(context.Background(), lease.DefaultName)
			ev.mu.Lock()
			ev.lost[holder] = time.Now()
			ev.live[holder] = err == nil && r.Holder == holder && r.Live()
			ev.mu.Unlock()
			ev.ch <- "lost " + holder
		},
	})
	require.NoError(t, err)
	return e
}

func next(t *testing.T, ev *events, want string) {
	t.Helper()
	select {
	case got := <-ev.ch:
		require.Equal(t, want, got)
	case <-time.After(20 * time.Second):
		t.Fatalf("waited for %q", want)
	}
}

// TestKilledLeader: the leader's process dies (its renewals stop, nothing is released):
// the standby takes over once the lease lapses, after the dead leader's fence.
func TestKilledLeader(t *testing.T) {
	s, url := open(t)
	s2, err := pglease.Open(context.Background(), url, 0)
	require.NoError(t, err)
	defer s2.Close()
	ev := newEvents()
	const ttl = 1500 * time.Millisecond
	fa := &flaky{Store: s}
	a := elector(t, fa, s2, "A", ev, ttl)
	b := elector(t, s2, s2, "B", ev, ttl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errA := make(chan error, 1)
	go func() { errA <- a.Run(ctx) }()
	next(t, ev, "elected A")
	go func() { _ = b.Run(ctx) }()
	require.Eventually(t, func() bool { return b.Status().Holder == "A" }, 5*time.Second, 10*time.Millisecond,
		"the standby learns who leads")
	require.Equal(t, "http://A", b.Status().Address)
	time.Sleep(2 * ttl) // A keeps the lease over several TTLs by renewing it
	require.True(t, a.Status().Leader)
	require.False(t, b.Status().Leader)

	fa.down.Store(true) // A is cut off: it can neither renew nor release
	next(t, ev, "lost A")
	next(t, ev, "elected B")
	require.ErrorIs(t, <-errA, lease.ErrLost)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	require.True(t, ev.live["A"], "A stepped down while the database still held its lease (fencing)")
	require.True(t, ev.lost["A"].Before(ev.elected["B"]))
	require.Equal(t, 1, b.Status().Takeovers)
	require.Equal(t, int64(2), b.Status().Term)
	require.True(t, a.Status().Lost)
}

// TestRenewalFailuresWithinTheTTL: renewals that fail for less than TTL − margin cost the
// leader nothing; a standby never takes over meanwhile.
func TestRenewalFailuresWithinTheTTL(t *testing.T) {
	s, url := open(t)
	s2, err := pglease.Open(context.Background(), url, 0)
	require.NoError(t, err)
	defer s2.Close()
	ev := newEvents()
	const ttl = 2 * time.Second // renew every 500 ms, step down 1.6 s after the last renewal
	fa := &flaky{Store: s}
	a := elector(t, fa, s2, "A", ev, ttl)
	b := elector(t, s2, s2, "B", ev, ttl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.Run(ctx) }()
	next(t, ev, "elected A")
	go func() { _ = b.Run(ctx) }()
	for range 3 {
		time.Sleep(700 * time.Millisecond)
		fa.down.Store(true)
		time.Sleep(400 * time.Millisecond) // a renewal or two lost, then a hung one abandoned
		fa.down.Store(false)
	}
	time.Sleep(time.Second)
	require.True(t, a.Status().Leader)
	require.False(t, b.Status().Leader)
	select {
	case e := <-ev.ch:
		t.Fatalf("unexpected %s", e)
	default:
	}
}

// TestRelease: a leader that stops cleanly releases the lease and the standby takes over
// at once, long before the TTL.
func TestRelease(t *testing.T) {
	s, url := open(t)
	s2, err := pglease.Open(context.Background(), url, 0)
	require.NoError(t, err)
	defer s2.Close()
	ev := newEvents()
	const ttl = time.Minute
	a := elector(t, s, s2, "A", ev, ttl)
	b := elector(t, s2, s2, "B", ev, ttl)
	actx, stopA := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errA := make(chan error, 1)
	go func() { errA <- a.Run(actx) }()
	next(t, ev, "elected A")
	go func() { _ = b.Run(ctx) }()
	require.Eventually(t, func() bool { return b.Status().Holder == "A" }, 5*time.Second, 10*time.Millisecond)
	stopA()
	require.ErrorIs(t, <-errA, context.Canceled)
	next(t, ev, "elected B") // within the test's 20 s, so not after the minute's TTL
	require.Equal(t, 1, b.Status().Takeovers)
}

func TestConfig(t *testing.T) {
	_, err := lease.New(lease.Config{})
	require.ErrorContains(t, err, "required")
	_, err = lease.New(lease.Config{Store: &flaky{}, Holder: "a", Address: "x", TTL: time.Second, RenewEvery: 900 * time.Millisecond})
	require.ErrorContains(t, err, "RenewEvery")
	e, err := lease.New(lease.Config{Store: &flaky{}, Holder: "a", Address: "x"})
	require.NoError(t, err)
	c := e.Config()
	require.Equal(t, lease.DefaultTTL, c.TTL)
	require.Equal(t, lease.DefaultTTL/4, c.RenewEvery)
	require.Equal(t, lease.DefaultTTL/5, c.Margin)
}

// slow answers renewals late: the database has renewed the lease, the leader hears it
// delay later.
type slow struct {
	lease.Store
	delay atomic.Int64
}

func (s *slow) Renew(ctx context.Context, name, holder string, term int64, ttl time.Duration) (lease.Record, error) {
	r, err := s.Store.Renew(ctx, name, holder, term, ttl)
	time.Sleep(time.Duration(s.delay.Load()))
	return r, err
}

// TestLateAnswersCountFromTheSend: the leader counts its TTL from when it sent a renewal,
// not from when the answer came. Answers within RenewEvery keep it leading; answers later
// than that are given up on, and it steps down TTL − margin after the last renewal whose
// answer it heard, while the database, which did renew, still holds the lease.
func TestLateAnswersCountFromTheSend(t *testing.T) {
	s, url := open(t)
	s2, err := pglease.Open(context.Background(), url, 0)
	require.NoError(t, err)
	defer s2.Close()
	ev := newEvents()
	const ttl = 2 * time.Second // renew every 500 ms; step down 1.6 s after the last heard renewal's send
	sl := &slow{Store: s}
	a := elector(t, sl, s2, "A", ev, ttl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.Run(ctx) }()
	next(t, ev, "elected A")
	sl.delay.Store(int64(300 * time.Millisecond))
	time.Sleep(2 * ttl)
	require.True(t, a.Status().Leader, "answers within RenewEvery keep the lease")

	sl.delay.Store(int64(time.Second))
	next(t, ev, "lost A")
	ev.mu.Lock()
	defer ev.mu.Unlock()
	require.True(t, ev.live["A"], "it stepped down while the database still held its lease")
}

// TestFencedWriteStepsDown: the leader's store is fenced with its term (Elector.Fence);
// once another holder has the lease, the leader's next write is refused (store.ErrFenced)
// and the leader steps down at once, long before its own clock would have made it; a
// step-down of a term it does not lead changes nothing.
func TestFencedWriteStepsDown(t *testing.T) {
	s, url := open(t)
	ctx := t.Context()
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	elected := make(chan lease.Record, 1)
	lost := make(chan error, 1)
	var a *lease.Elector
	a, err = lease.New(lease.Config{
		Store: s, Holder: "A", Address: "http://A", TTL: time.Minute,
		OnElected: func(rec lease.Record) {
			if err := st.SetFence(a.Fence(rec)); err != nil {
				t.Error(err)
			}
			elected <- rec
		},
		OnLost: func(err error) { lost <- err },
	})
	require.NoError(t, err)
	errA := make(chan error, 1)
	go func() { errA <- a.Run(ctx) }()
	rec := <-elected
	require.NoError(t, st.PutSession(ctx, "ws", &loopsv1.Session{Id: "s1"}), "the leader writes")

	a.StepDown(rec.Term+1, errors.New("not this term"))
	time.Sleep(200 * time.Millisecond)
	require.True(t, a.Status().Leader, "a step-down of another term is ignored")

	// B takes the lease over (as after a lapse the leader did not notice: a paused process).
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `UPDATE loops_leader_lease SET holder = 'B', term = term + 1 WHERE name = $1`, lease.DefaultName)
	require.NoError(t, err)

	start := time.Now()
	err = st.PutSession(ctx, "ws", &loopsv1.Session{Id: "s2"})
	require.ErrorIs(t, err, store.ErrFenced)
	select {
	case err := <-lost:
		require.ErrorIs(t, err, store.ErrFenced)
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not step down after a fenced write")
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, <-errA, lease.ErrLost)
	require.False(t, a.Status().Leader)
	_, err = st.GetSession(ctx, "ws", "s2")
	require.ErrorIs(t, err, store.ErrNotFound)
}
