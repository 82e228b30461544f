package pools

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode"

	"connectrpc.com/connect"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// RegistryOptions configure a Registry. Zero values mean the documented defaults.
type RegistryOptions struct {
	// JoinToken is the shared secret workers present. Empty: every registration is refused.
	JoinToken string
	// MaxRegistrations bounds the replicas registered at once (default 1024); more get
	// RESOURCE_EXHAUSTED.
	MaxRegistrations int
	// HeartbeatInterval is how often workers are told to beat (default 2s, and at most a
	// third of the timeout, so one late beat never loses a replica); HeartbeatTimeout is how
	// long without a beat marks a replica lost (default 10s).
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	// Logger receives membership changes (default slog.Default()).
	Logger *slog.Logger
}

// Member is one registered replica.
type Member struct {
	Pool         string
	Replica      int
	Address      string
	Incarnation  string
	GPUs         int
	Capabilities *backendv1.GetCapabilitiesResponse
	Since        time.Time
}

type key struct {
	pool    string
	replica int
}

type entry struct {
	m       Member
	lease   string
	timer   *time.Timer   // nil for announced (in-process) members
	ended   chan struct{} // closed when the lease ends
	dropped bool          // ended because its pool was deleted: the worker drains
}

// slotUsed is what a replica slot's ended registrations used.
type slotUsed struct {
	registered time.Duration
	lostAt     time.Time
}

type poolState struct {
	desired int
	changed chan struct{} // closed and replaced when desired changes or the pool goes
}

// Registry is the gateway's side of RegistryService: the replicas that registered, their
// leases, and the desired size of the pools providers manage. Safe for concurrent use.
type Registry struct {
	opts  RegistryOptions
	log   *slog.Logger
	token [32]byte

	mu      sync.Mutex
	members map[key]*entry
	leases  map[string]*entry
	pools   map[string]*poolState
	lost    map[key]string // why a replica was last lost (bounded: cleared when large)
	// dropped holds the leases of deleted pools' workers, so a beat that races the deletion
	// is told to drain rather than to register again (bounded: cleared when large).
	dropped map[string]struct{}
	// used is the registered time of the ended registrations of managed pools' replica
	// slots (bounded: one entry per slot, removed with the pool; see Usage).
	used   map[key]*slotUsed
	notify chan struct{} // closed and replaced on every change
	closed bool
}

var _ backendv1connect.RegistryServiceHandler = (*Registry)(nil)

// NewRegistry returns an empty registry.
func NewRegistry(o RegistryOptions) *Registry {
	if o.MaxRegistrations <= 0 {
		o.MaxRegistrations = 1024
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 2 * time.Second
	}
	if o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = 10 * time.Second
	}
	o.HeartbeatInterval = min(o.HeartbeatInterval, o.HeartbeatTimeout/3)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Registry{opts: o, log: o.Logger.With(slog.String("component", "pools.registry")), token: sha256.Sum256([]byte(o.JoinToken)),
		members: map[key]*entry{}, leases: map[string]*entry{}, pools: map[string]*poolState{}, lost: map[key]string{}, dropped: map[string]struct{}{}, used: map[key]*slotUsed{}, notify: make(chan struct{})}
}

// Handler returns the RegistryService's path and handler (requests bounded to 1 MiB).
func (r *Registry) Handler() (string, http.Handler) {
	return backendv1connect.NewRegistryServiceHandler(r, connect.WithReadMaxBytes(1<<20))
}

// HeartbeatTimeout is how long a replica may go without a beat.
func (r *Registry) HeartbeatTimeout() time.Duration { return r.opts.HeartbeatTimeout }

// Close ends every lease (their heartbeat streams end) without reporting replicas lost.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, e := range r.members {
		r.endLocked(e)
	}
	r.changedLocked()
}

func (r *Registry) changedLocked() {
	close(r.notify)
	r.notify = make(chan struct{})
}

// Changed returns a channel closed at the next change of membership or of a pool's desired
// size. Read Members (or Desired) after it closes, then call Changed again.
func (r *Registry) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.notify
}

// Members returns the pool's registered replicas, by replica index.
func (r *Registry) Members(pool string) []Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Member
	for k, e := range r.members {
		if k.pool == pool {
			out = append(out, e.m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return a.Replica - b.Replica })
	return out
}

// Pools returns the ids of the pools with a registered replica or a desired size, sorted.
func (r *Registry) Pools() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for k := range r.members {
		seen[k.pool] = true
	}
	for p := range r.pools {
		seen[p] = true
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// SetDesired records a managed pool's desired size: replicas at or beyond it are refused at
// registration and told to drain in their heartbeats, and WatchPool streams tell the
// pool's agent.
func (r *Registry) SetDesired(pool string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.pools[pool]
	if ps == nil {
		ps = &poolState{desired: -1, changed: make(chan struct{})}
		r.pools[pool] = ps
	}
	if ps.desired == n {
		return
	}
	ps.desired = n
	close(ps.changed)
	ps.changed = make(chan struct{})
	r.changedLocked()
}

// Desired returns a managed pool's desired size (ok false for a pool no provider manages).
func (r *Registry) Desired(pool string) (n int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.pools[pool]
	if ps == nil {
		return 0, false
	}
	return ps.desired, true
}

// DropPool forgets a pool: its leases end (workers are told at their next beat) and it is
// no longer managed.
func (r *Registry) DropPool(pool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, e := range r.members {
		if k.pool == pool {
			e.dropped = true
			if len(r.dropped) >= 4*r.opts.MaxRegistrations {
				clear(r.dropped)
			}
			r.dropped[e.lease] = struct{}{}
			r.removeLocked(e, why)
		}
	}
	if ps := r.pools[pool]; ps != nil {
		close(ps.changed)
		delete(r.pools, pool)
	}
	for k := range r.lost {
		if k.pool == pool {
			delete(r.lost, k)
		}
	}
	for k := range r.used {
		if k.pool == pool {
			delete(r.used, k)
		}
	}
	r.changedLocked()
}

// Announce registers a member in process, without a heartbeat (the static provider's
// workers, probed by it instead). It replaces an earlier member of the same replica.
func (r *Registry) Announce(m Member) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key{m.Pool, m.Replica}
	if old := r.members[k]; old != nil {
		if old.m.Incarnation == m.Incarnation && old.m.Address == m.Address {
			return
		}
		r.removeLocked(old, "replaced by incarnation "+m.Incarnation)
	}
	if m.Since.IsZero() {
		m.Since = time.Now()
	}
	e := &entry{m: m, lease: newID(), ended: make(chan struct{})}
	r.members[k] = e
	r.leases[e.lease] = e
	r.changedLocked()
}

// Remove marks a replica lost (an exited process, a stopped Ray actor).
func (r *Registry) Remove(pool string, replica int, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.members[key{pool, replica}]; e != nil {
		r.removeLocked(e, why)
		r.changedLocked()
	}
}

// LostReason says why the replica was last lost ("" if unknown).
func (r *Registry) LostReason(pool string, replica int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost[key{pool, replica}]
}

// SlotUsage is what one replica slot of a pool has used.
type SlotUsage struct {
	// Replica is the slot's replica index.
	Replica int
	// Registered is how long replicas were registered in the slot, every incarnation
	// together, the current one up to now. The time of a managed pool's slots is kept
	// after their replicas leave (scaled down, lost) until the pool is deleted; an
	// unmanaged pool's slots count only their current registration.
	Registered time.Duration
	// LostAt is when the slot's last registration ended; zero while a replica is
	// registered in it, or when none ever was.
	LostAt time.Time
}

// Usage returns the registered time of the pool's replica slots, by replica index: the
// slots with a registered replica and those whose earlier registrations are remembered.
func (r *Registry) Usage(pool string) []SlotUsage {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	byReplica := map[int]*SlotUsage{}
	for k, u := range r.used {
		if k.pool == pool {
			byReplica[k.replica] = &SlotUsage{Replica: k.replica, Registered: u.registered, LostAt: u.lostAt}
		}
	}
	for k, e := range r.members {
		if k.pool != pool {
			continue
		}
		su := byReplica[k.replica]
		if su == nil {
			su = &SlotUsage{Replica: k.replica}
			byReplica[k.replica] = su
		}
		if !r.closed {
			su.Registered += max(now.Sub(e.m.Since), 0)
		}
		su.LostAt = time.Time{}
	}
	out := make([]SlotUsage, 0, len(byReplica))
	for _, su := range byReplica {
		out = append(out, *su)
	}
	slices.SortFunc(out, func(a, b SlotUsage) int { return a.Replica - b.Replica })
	return out
}

func (r *Registry) endLocked(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	select {
	case <-e.ended:
	default:
		close(e.ended)
	}
	delete(r.leases, e.lease)
}

func (r *Registry) removeLocked(e *entry, why string) {
	k := key{e.m.Pool, e.m.Replica}
	if r.members[k] != e {
		return
	}
	r.endLocked(e)
	delete(r.members, k)
	if _, managed := r.pools[k.pool]; managed {
		u := r.used[k]
		if u == nil {
			u = &slotUsed{}
			r.used[k] = u
		}
		now := time.Now()
		u.registered += now.Sub(e.m.Since)
		u.lostAt = now
	}
	if len(r.lost) >= 4*r.opts.MaxRegistrations {
		clear(r.lost)
	}
	r.lost[k] = why
	r.log.Warn("replica lost", slog.String("pool", e.m.Pool), slog.Int("replica", e.m.Replica),
		slog.String("incarnation", e.m.Incarnation), slog.String("address", e.m.Address), slog.String("why", why))
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (r *Registry) checkToken(tok string) error {
	if r.opts.JoinToken == "" {
		return connect.NewError(connect.CodePermissionDenied, errors.New("worker registration is off: the gateway was started without a join token (set one, e.g. --backend-opt join_token_file=FILE, and give workers the same token)"))
	}
	if len(tok) > 4096 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("join_token is longer than 4096 bytes"))
	}
	got := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(got[:], r.token[:]) != 1 {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("the join token does not match the gateway's; start the worker with the gateway's token (--join-token-file)"))
	}
	return nil
}

// ValidateRegister says what is wrong with a registration's fields (not the token).
func ValidateRegister(req *backendv1.RegisterRequest) error {
	if !idRE.MatchString(req.GetPoolId()) {
		return fmt.Errorf("pool_id %q must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", req.GetPoolId())
	}
	if req.GetReplica() >= MaxReplicas {
		return fmt.Errorf("replica %d must be below %d", req.GetReplica(), MaxReplicas)
	}
	if req.GetGpus() > MaxGPUsPerReplica {
		return fmt.Errorf("gpus %d must be at most %d", req.GetGpus(), MaxGPUsPerReplica)
	}
	if err := validAddress(req.GetAddress()); err != nil {
		return err
	}
	inc := req.GetIncarnationId()
	if inc == "" || len(inc) > 128 {
		return fmt.Errorf("incarnation_id must be 1-128 characters (a random id per process start), got %d", len(inc))
	}
	for _, c := range inc {
		if c > unicode.MaxASCII || !unicode.IsPrint(c) || c == ' ' {
			return fmt.Errorf("incarnation_id %q must be printable ASCII without spaces", inc)
		}
	}
	return nil
}

func validAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || len(a) > 300 {
		return fmt.Errorf("address %q must be host:port where the worker serves (at most 300 characters)", a)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("address %q: port must be 1-65535", a)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("address %q is a wildcard; register the address the gateway can dial (the worker's --advertise host)", a)
	}
	return nil
}

// Register implements RegistryService.Register.
func (r *Registry) Register(_ context.Context, req *backendv1.RegisterRequest) (*backendv1.RegisterResponse, error) {
	if err := r.checkToken(req.GetJoinToken()); err != nil {
		return nil, err
	}
	if err := ValidateRegister(req); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	k := key{req.GetPoolId(), int(req.GetReplica())}
	resp := func(e *entry) *backendv1.RegisterResponse {
		return &backendv1.RegisterResponse{LeaseId: e.lease, HeartbeatIntervalMs: uint32(r.opts.HeartbeatInterval.Milliseconds()),
			HeartbeatTimeoutMs: uint32(r.opts.HeartbeatTimeout.Milliseconds())}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the gateway is shutting down; register again shortly"))
	}
	if ps := r.pools[k.pool]; ps != nil && k.replica >= ps.desired {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("pool %s has %d replicas; replica %d is beyond it (scaled down): stop this worker", k.pool, ps.desired, k.replica))
	}
	old := r.members[k]
	if old != nil && old.m.Incarnation == req.GetIncarnationId() && old.m.Address == req.GetAddress() {
		r.resetLocked(old)
		return resp(old), nil
	}
	if old == nil && len(r.members) >= r.opts.MaxRegistrations {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the gateway holds %d registrations, its limit; deregister unused workers or raise the limit", len(r.members)))
	}
	if old != nil {
		r.removeLocked(old, "replaced by incarnation "+req.GetIncarnationId())
	}
	e := &entry{m: Member{Pool: k.pool, Replica: k.replica, Address: req.GetAddress(), Incarnation: req.GetIncarnationId(),
		GPUs: int(req.GetGpus()), Capabilities: req.GetCapabilities(), Since: time.Now()}, lease: newID(), ended: make(chan struct{})}
	e.timer = time.AfterFunc(r.opts.HeartbeatTimeout, func() { r.expire(e) })
	r.members[k] = e
	r.leases[e.lease] = e
	r.changedLocked()
	r.log.Info("replica registered", slog.String("pool", k.pool), slog.Int("replica", k.replica),
		slog.String("incarnation", e.m.Incarnation), slog.String("address", e.m.Address))
	return resp(e), nil
}

func (r *Registry) resetLocked(e *entry) {
	if e.timer != nil {
		e.timer.Reset(r.opts.HeartbeatTimeout)
	}
}

func (r *Registry) expire(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.members[key{e.m.Pool, e.m.Replica}] != e {
		return
	}
	r.removeLocked(e, fmt.Sprintf("no heartbeat for %v", r.opts.HeartbeatTimeout))
	r.changedLocked()
}

// beat renews a lease; it reports whether the replica should drain, and the lease's entry
// (nil when it does not exist, with drain set when its pool was deleted).
func (r *Registry) beat(lease string) (drain bool, e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e = r.leases[lease]
	if e == nil {
		_, drain = r.dropped[lease]
		return drain, nil
	}
	r.resetLocked(e)
	if ps := r.pools[e.m.Pool]; ps != nil && e.m.Replica >= ps.desired {
		drain = true
	}
	return drain, e
}

// Heartbeat implements RegistryService.Heartbeat. The first beat must come within the
// heartbeat timeout and name a live lease, so a stream without a lease holds nothing long.
func (r *Registry) Heartbeat(ctx context.Context, st *connect.BidiStream[backendv1.HeartbeatRequest, backendv1.HeartbeatResponse]) error {
	beats := make(chan *backendv1.HeartbeatRequest)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(beats)
		for {
			m, err := st.Receive()
			if err != nil {
				return
			}
			select {
			case beats <- m:
			case <-done:
				return
			}
		}
	}()
	var lease string
	select {
	case <-ctx.Done():
		return nil
	case first, open := <-beats:
		if !open {
			return nil // the worker went away before its first beat; its timer decides
		}
		lease = first.GetLeaseId()
	case <-time.After(r.opts.HeartbeatTimeout):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("no heartbeat within %v of opening the stream; send {lease_id} first", r.opts.HeartbeatTimeout))
	}
	drain, e := r.beat(lease)
	if e == nil && drain { // its pool was deleted
		_ = st.Send(&backendv1.HeartbeatResponse{Drain: true})
		return nil
	}
	if e == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("the lease is unknown or ended (replaced by a newer incarnation, deregistered or expired): register again"))
	}
	if err := st.Send(&backendv1.HeartbeatResponse{Drain: drain}); err != nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.ended:
			r.mu.Lock()
			dropped := e.dropped
			r.mu.Unlock()
			if dropped {
				_ = st.Send(&backendv1.HeartbeatResponse{Drain: true})
				return nil
			}
			return connect.NewError(connect.CodeNotFound, errors.New("the lease ended (replaced by a newer incarnation, deregistered, expired, or the pool was deleted)"))
		case _, open := <-beats:
			if !open {
				return nil // stream closed; the lease lives until its timer expires
			}
			drain, cur := r.beat(lease)
			if cur == nil && drain { // its pool was deleted while this beat was on its way
				_ = st.Send(&backendv1.HeartbeatResponse{Drain: true})
				return nil
			}
			if cur == nil {
				return connect.NewError(connect.CodeNotFound, errors.New("the lease ended: register again"))
			}
			if err := st.Send(&backendv1.HeartbeatResponse{Drain: drain}); err != nil {
				return nil
			}
		}
	}
}

// Deregister implements RegistryService.Deregister.
func (r *Registry) Deregister(_ context.Context, req *backendv1.DeregisterRequest) (*backendv1.DeregisterResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.leases[req.GetLeaseId()]; e != nil {
		r.removeLocked(e, "deregistered")
		r.changedLocked()
	}
	return &backendv1.DeregisterResponse{}, nil
}

// WatchPool implements RegistryService.WatchPool.
func (r *Registry) WatchPool(ctx context.Context, req *backendv1.WatchPoolRequest, st *connect.ServerStream[backendv1.WatchPoolResponse]) error {
	if err := r.checkToken(req.GetJoinToken()); err != nil {
		return err
	}
	last := -1
	for {
		r.mu.Lock()
		ps := r.pools[req.GetPoolId()]
		var n int
		var changed chan struct{}
		if ps != nil {
			n, changed = ps.desired, ps.changed
		}
		r.mu.Unlock()
		if ps == nil {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("pool %q is not managed by this gateway (deleted, or never created)", req.GetPoolId()))
		}
		if n != last {
			if err := st.Send(&backendv1.WatchPoolResponse{DesiredReplicas: uint32(max(n, 0))}); err != nil {
				return nil
			}
			last = n
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Watch turns the registry's membership of one pool into events, starting with the current
// replicas; a managed pool's removal ends it with Deleted. Every provider's Watch is this.
func (r *Registry) Watch(ctx context.Context, pool string) <-chan Event {
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		prev := map[int]Member{}
		_, wasManaged := r.Desired(pool)
		send := func(ev Event) bool {
			ev.Pool, ev.Time = pool, time.Now()
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for {
			ch := r.Changed()
			cur := map[int]Member{}
			for _, m := range r.Members(pool) {
				cur[m.Replica] = m
			}
			_, managed := r.Desired(pool)
			idx := make([]int, 0, len(prev)+len(cur))
			for i := range prev {
				idx = append(idx, i)
			}
			for i := range cur {
				if _, ok := prev[i]; !ok {
					idx = append(idx, i)
				}
			}
			slices.Sort(idx)
			for _, i := range idx {
				p, had := prev[i]
				c, has := cur[i]
				if had && (!has || c.Incarnation != p.Incarnation) {
					why := r.LostReason(pool, i)
					if has && why == "" {
						why = "replaced by incarnation " + c.Incarnation
					}
					if !send(Event{Kind: Lost, Replica: i, Incarnation: p.Incarnation, Address: p.Address, Reason: why}) {
						return
					}
				}
				if has && (!had || c.Incarnation != p.Incarnation) {
					if !send(Event{Kind: Up, Replica: i, Incarnation: c.Incarnation, Address: c.Address}) {
						return
					}
				}
			}
			prev = cur
			if wasManaged && !managed {
				send(Event{Kind: Deleted, Replica: -1, Reason: "the pool was deleted"})
				return
			}
			wasManaged = wasManaged || managed
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
		}
	}()
	return out
}
