package console_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/console"
)

// startServerWith runs a gateway with two keys in two workspaces (ws-a, ws-b), after edit
// (when not nil) changes its config.
func startServerWith(t testing.TB, edit func(*gateway.Config)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA + "=ws-a", keyB + "=ws-b"})
	require.NoError(t, err)
	cfg := gateway.Config{DataDir: t.TempDir(), Keys: keys}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := gateway.New(context.Background(), ln, cfg)
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + ln.Addr().String()
}

// browserFrom is a browser whose connections come from the loopback address ip.
func browserFrom(t testing.TB, base, ip string) *browser {
	b := newBrowser(t, base)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	b.c.Transport = &http.Transport{DialContext: d.DialContext}
	return b
}

// TestSignInIsThrottled: wrong keys sent to the sign-in form from one address are soon
// answered 429 with Retry-After (the key is not even tried), while a browser at another
// address signs in at once.
func TestSignInIsThrottled(t *testing.T) {
	base := startServer(t)
	attacker := browserFrom(t, base, "127.0.0.2")
	codes := map[int]int{}
	var retry string
	for i := range 300 {
		code, h, body := attacker.post(console.SignInPath, url.Values{"api_key": {"tml-guess-" + strconv.Itoa(i)}})
		codes[code]++
		if code == http.StatusTooManyRequests {
			retry = h.Get("Retry-After")
			require.Contains(t, body, "wrong API keys")
		}
	}
	require.LessOrEqual(t, codes[http.StatusUnauthorized], 20, "%v", codes)
	require.Equal(t, 300, codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests], "%v", codes)
	require.NotEmpty(t, retry)
	code, _, _ := attacker.post(console.SignInPath, url.Values{"api_key": {keyA}})
	require.Equal(t, http.StatusTooManyRequests, code, "the throttled address's keys are not tried")

	browserFrom(t, base, "127.0.0.1").signIn(keyA)
}

// TestCookieIsSecureBehindATrustedProxy: behind a TLS-terminating proxy that is among
// the trusted proxies, X-Forwarded-Proto: https makes the session cookie Secure; the same
// header from any other address is ignored.
func TestCookieIsSecureBehindATrustedProxy(t *testing.T) {
	base := startServerWith(t, func(c *gateway.Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	signIn := func(ip string) string {
		b := browserFrom(t, base, ip)
		req, err := http.NewRequest(http.MethodPost, base+console.SignInPath, strings.NewReader(url.Values{"api_key": {keyA}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-Proto", "https")
		code, h, body := b.do(req)
		require.Equal(t, http.StatusSeeOther, code, body)
		return h.Get("Set-Cookie")
	}
	require.Contains(t, signIn("127.0.0.1"), "; Secure", "from the trusted proxy")
	require.NotContains(t, signIn("127.0.0.2"), "Secure", "from an untrusted address")
}
