package auth

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a settable time.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// retryAfter is the wait err (a *ThrottledError) asks for.
func retryAfter(t *testing.T, err error) time.Duration {
	t.Helper()
	var te *ThrottledError
	require.ErrorAs(t, err, &te)
	return te.RetryAfter
}

func TestThrottleBudgetsPerClient(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	th := NewThrottle(ThrottleOptions{FailuresPerClient: 3, FailureEvery: time.Second, Now: c.now})
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for range 3 {
		require.NoError(t, th.Failed(a), "within the budget: answered as a failure")
	}
	require.Error(t, th.Check(a), "the budget spent: a right key from the address is refused too")
	err := th.Failed(a)
	require.True(t, IsThrottled(err))
	first := retryAfter(t, err)
	for range 5 {
		_ = th.Failed(a)
	}
	require.Greater(t, retryAfter(t, th.Check(a)), first, "trying on while throttled waits longer")
	require.NoError(t, th.Check(b), "another address is not slowed")
	require.NoError(t, th.Failed(b))

	// The debt is bounded, then paid off with time.
	for range 10000 {
		_ = th.Failed(a)
	}
	require.LessOrEqual(t, retryAfter(t, th.Check(a)), maxBlock+time.Second)
	c.t = c.t.Add(maxBlock + 2*time.Second)
	require.NoError(t, th.Check(a))
}

func TestThrottleGlobalBudget(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	th := NewThrottle(ThrottleOptions{FailuresPerClient: 2, Failures: 4, GlobalFailureEvery: time.Second, Now: c.now})
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	for i := range 4 {
		require.NoError(t, th.Failed(addr(i)))
	}
	require.True(t, IsThrottled(th.Failed(addr(4))), "all clients together are over their budget")
	require.True(t, IsThrottled(th.Check(addr(0))), "an address with recent failures waits for the global budget")
	require.NoError(t, th.Check(addr(9)), "an address with no failures is never slowed")
	c.t = c.t.Add(time.Second)
	require.NoError(t, th.Check(addr(0)))

	// A throttled address's tries do not spend the global budget.
	th = NewThrottle(ThrottleOptions{FailuresPerClient: 1, Failures: 2, GlobalFailureEvery: time.Hour, Now: c.now})
	for range 100 {
		_ = th.Failed(addr(1))
	}
	require.NoError(t, th.Failed(addr(2)))
}

func TestThrottleTableIsBoundedAndForgets(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	th := NewThrottle(ThrottleOptions{FailuresPerClient: 2, FailureEvery: time.Second, MaxClients: 3, Failures: 1000, Now: c.now})
	for i := range 10 {
		_ = th.Failed(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	require.Equal(t, 3, th.Clients())
	c.t = c.t.Add(2 * time.Second) // budgets whole again
	require.NoError(t, th.Failed(netip.MustParseAddr("10.0.1.1")))
	require.Equal(t, 1, th.Clients(), "whole budgets are forgotten when room is needed")
}

func TestThrottleGroupsIPv6ByPrefix(t *testing.T) {
	th := NewThrottle(ThrottleOptions{FailuresPerClient: 1})
	require.NoError(t, th.Failed(netip.MustParseAddr("2001:db8:1:2::1")))
	require.True(t, IsThrottled(th.Failed(netip.MustParseAddr("2001:db8:1:2:ffff::9"))), "the same /64")
	require.NoError(t, th.Failed(netip.MustParseAddr("2001:db8:1:3::1")), "another /64")
	require.NoError(t, th.Failed(netip.MustParseAddr("::ffff:192.0.2.1")))
	require.True(t, IsThrottled(th.Failed(netip.MustParseAddr("192.0.2.1"))), "an IPv4-mapped address is the IPv4 address")
}

func TestTrustedProxies(t *testing.T) {
	p, err := ParseTrustedProxies([]string{"10.0.0.0/8", "192.0.2.7", " "})
	require.NoError(t, err)
	_, err = ParseTrustedProxies([]string{"nope"})
	require.ErrorContains(t, err, "CIDR")
	req := func(peer string, hdr ...string) *testReq {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		return &testReq{r}
	}
	for _, tc := range []struct {
		r     *testReq
		addr  string
		https bool
	}{
		{req("203.0.113.5:1234"), "203.0.113.5", false},
		{req("203.0.113.5:1234", "X-Forwarded-For", "1.2.3.4", "X-Forwarded-Proto", "https"), "203.0.113.5", false},
		{req("10.1.2.3:80", "X-Forwarded-For", "1.2.3.4", "X-Forwarded-Proto", "https"), "1.2.3.4", true},
		{req("10.1.2.3:80", "X-Forwarded-For", "6.6.6.6, 1.2.3.4, 10.9.9.9", "X-Forwarded-Proto", "http, https"), "1.2.3.4", true},
		{req("10.1.2.3:80", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "1.2.3.4"), "1.2.3.4", false},
		{req("10.1.2.3:80", "X-Forwarded-For", "10.0.0.1"), "10.0.0.1", false},
		{req("10.1.2.3:80", "X-Forwarded-For", "junk, 1.2.3.4"), "1.2.3.4", false},
		{req("10.1.2.3:80", "X-Forwarded-For", "1.2.3.4, junk"), "10.1.2.3", false},
		{req("192.0.2.7:80", "X-Forwarded-Proto", "https, http"), "192.0.2.7", false},
		{req("[::ffff:10.0.0.1]:80", "X-Forwarded-Proto", "HTTPS"), "10.0.0.1", true},
	} {
		require.Equal(t, netip.MustParseAddr(tc.addr), p.ClientAddr(tc.r.Request), "%v %v", tc.r.RemoteAddr, tc.r.Header)
		require.Equal(t, tc.https, p.HTTPS(tc.r.Request), "%v %v", tc.r.RemoteAddr, tc.r.Header)
	}
	var none TrustedProxies
	r := req("10.1.2.3:80", "X-Forwarded-For", "1.2.3.4", "X-Forwarded-Proto", "https")
	require.Equal(t, netip.MustParseAddr("10.1.2.3"), none.ClientAddr(r.Request))
	require.False(t, none.HTTPS(r.Request))
}

type testReq struct{ *http.Request }

// TestMiddlewareCountsGuessesOnly: only well-formed keys that are not configured count
// against an address; missing and malformed keys (which cannot be right) do not.
func TestMiddlewareCountsGuessesOnly(t *testing.T) {
	k, err := ParseKeys([]string{"tml-right=ws"})
	require.NoError(t, err)
	h := k.Middleware(Policy{Throttle: NewThrottle(ThrottleOptions{FailuresPerClient: 3})},
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	call := func(key string) int {
		r := httptest.NewRequest("GET", "/v1/models", nil)
		r.RemoteAddr = "192.0.2.1:5"
		r.Header.Set(HeaderName, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for range 20 {
		require.Equal(t, http.StatusUnauthorized, call(""))
		require.Equal(t, http.StatusUnauthorized, call("sk-not-ours"))
	}
	require.Equal(t, http.StatusOK, call("tml-right"))
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, call("tml-guess"))
	}
	require.Equal(t, http.StatusTooManyRequests, call("tml-guess"))
	require.Equal(t, http.StatusTooManyRequests, call("tml-right"))
}
