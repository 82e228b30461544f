package auth

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of ThrottleOptions.
const (
	// DefaultFailuresPerClient is how many wrong keys one client address may send at once;
	// DefaultFailureEvery adds one more to its budget: 10 at once, then 10 a minute.
	DefaultFailuresPerClient = 10
	DefaultFailureEvery      = 6 * time.Second
	// DefaultFailures is how many wrong keys all clients together may send at once;
	// DefaultGlobalFailureEvery adds one more: 200 at once, then 20 a second.
	DefaultFailures           = 200
	DefaultGlobalFailureEvery = 50 * time.Millisecond
	// DefaultMaxClients bounds the client addresses the throttle remembers.
	DefaultMaxClients = 16384
	// maxBlock bounds how far a client that keeps sending wrong keys is pushed back.
	maxBlock = 15 * time.Minute
)

// ThrottleOptions tune a Throttle. Zero values take the defaults.
type ThrottleOptions struct {
	// FailuresPerClient wrong keys from one client address are answered as usual; past
	// them the address must wait FailureEvery for each further try (defaults
	// DefaultFailuresPerClient and DefaultFailureEvery).
	FailuresPerClient int
	FailureEvery      time.Duration
	// Failures and GlobalFailureEvery bound the wrong keys of all addresses together in the
	// same way (defaults DefaultFailures and DefaultGlobalFailureEvery).
	Failures           int
	GlobalFailureEvery time.Duration
	// MaxClients bounds the addresses remembered (default DefaultMaxClients).
	MaxClients int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o ThrottleOptions) withDefaults() ThrottleOptions {
	if o.FailuresPerClient <= 0 {
		o.FailuresPerClient = DefaultFailuresPerClient
	}
	if o.FailureEvery <= 0 {
		o.FailureEvery = DefaultFailureEvery
	}
	if o.Failures <= 0 {
		o.Failures = DefaultFailures
	}
	if o.GlobalFailureEvery <= 0 {
		o.GlobalFailureEvery = DefaultGlobalFailureEvery
	}
	if o.MaxClients <= 0 {
		o.MaxClients = DefaultMaxClients
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Throttle slows down the guessing of API keys: it counts the wrong keys (well-formed keys
// that are not configured, ErrUnknownKey) each client address sends (a token bucket per address, IPv6 addresses by their /64) and all of them
// together, and once an address is over its budget every authentication from it is
// refused for a while, a right key's too, so that a throttled client learns nothing about
// the keys it tries. Keys are checked first, and a request whose key is right is refused
// only when its own address is throttled: another address's failures never slow it,
// however many there are.
//
// The table of addresses is bounded (MaxClients) and forgets an address once its budget
// is whole again. While the table is full and all clients together are over their budget,
// a wrong key from an address the table has no room for is refused too.
//
// Nothing is done under its lock but arithmetic on at most MaxClients entries.
type Throttle struct {
	o      ThrottleOptions
	mu     sync.Mutex
	global *rate.Limiter
	byAddr map[netip.Addr]*rate.Limiter
}

// NewThrottle returns a throttle with o's budgets.
func NewThrottle(o ThrottleOptions) *Throttle {
	o = o.withDefaults()
	return &Throttle{o: o, global: rate.NewLimiter(rate.Every(o.GlobalFailureEvery), o.Failures),
		byAddr: map[netip.Addr]*rate.Limiter{}}
}

// ThrottledError is the refusal of a throttled address: wait RetryAfter before trying
// again.
type ThrottledError struct {
	RetryAfter time.Duration
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("too many wrong API keys from this address: wait %s before trying again (a right key from this address is refused meanwhile too)",
		time.Duration(math.Ceil(e.RetryAfter.Seconds()))*time.Second)
}

// clientKey is the throttle's key for an address: an IPv4 address itself, an IPv6 one its
// /64 (one subscriber's prefix). An invalid address (a request with no peer) is the zero
// key, one client.
func clientKey(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return a
}

// Failed counts a wrong key from client and returns a *ThrottledError when the client was
// already over its budget, or all clients together are over theirs (answer it instead of
// the failure), nil otherwise. A client that keeps trying while throttled waits longer, up
// to 15 minutes.
func (t *Throttle) Failed(client netip.Addr) error {
	if t == nil {
		return nil
	}
	now := t.o.Now()
	key := clientKey(client)
	t.mu.Lock()
	defer t.mu.Unlock()
	lim := t.byAddr[key]
	if lim == nil {
		if len(t.byAddr) >= t.o.MaxClients {
			t.sweepLocked(now)
		}
		if len(t.byAddr) >= t.o.MaxClients {
			// No room to remember this address: only the budget of all clients holds it.
			if !t.global.AllowN(now, 1) {
				return &ThrottledError{RetryAfter: waitFor(t.global, now)}
			}
			return nil
		}
		lim = rate.NewLimiter(rate.Every(t.o.FailureEvery), t.o.FailuresPerClient)
		t.byAddr[key] = lim
	}
	if wait := waitFor(lim, now); wait > 0 {
		// Throttled already: each further try pushes it back (to at most maxBlock), and
		// does not spend the budget of all clients.
		if wait < maxBlock {
			lim.ReserveN(now, 1)
		}
		return &ThrottledError{RetryAfter: waitFor(lim, now)}
	}
	lim.AllowN(now, 1)
	if !t.global.AllowN(now, 1) {
		return &ThrottledError{RetryAfter: waitFor(t.global, now)}
	}
	return nil
}

// Check returns a *ThrottledError when client is throttled now: over its own budget, or
// with recent failures while all clients together are over theirs. An address with no
// recent failures is never throttled.
func (t *Throttle) Check(client netip.Addr) error {
	if t == nil {
		return nil
	}
	now := t.o.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	lim := t.byAddr[clientKey(client)]
	if lim == nil {
		return nil
	}
	if d := waitFor(lim, now); d > 0 {
		return &ThrottledError{RetryAfter: d}
	}
	if d := waitFor(t.global, now); d > 0 {
		return &ThrottledError{RetryAfter: d}
	}
	return nil
}

// Clients is the number of addresses the throttle remembers.
func (t *Throttle) Clients() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byAddr)
}

// sweepLocked forgets the addresses whose budget is whole again.
func (t *Throttle) sweepLocked(now time.Time) {
	for k, lim := range t.byAddr {
		if lim.TokensAt(now) >= float64(lim.Burst()) {
			delete(t.byAddr, k)
		}
	}
}

// waitFor is how long until lim has a whole token: 0 when it has one now.
func waitFor(lim *rate.Limiter, now time.Time) time.Duration {
	tok := lim.TokensAt(now)
	if tok >= 1 {
		return 0
	}
	s := (1 - tok) / float64(lim.Limit())
	if math.IsInf(s, 0) || math.IsNaN(s) || s > maxBlock.Seconds()*2 {
		return 2 * maxBlock
	}
	return time.Duration(s * float64(time.Second))
}

// IsThrottled reports whether err is a *ThrottledError.
func IsThrottled(err error) bool {
	var te *ThrottledError
	return errors.As(err, &te)
}
