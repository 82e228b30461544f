package gateway_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// clientFrom returns an HTTP client whose connections come from the loopback address ip
// (127.0.0.0/8 is all this host's), so that a test can be several clients.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// listModels calls ListModels over REST with key from c and returns the status, the
// Retry-After header and the body.
func listModels(t *testing.T, c *http.Client, url, key string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// TestFailedAuthenticationsAreThrottled: a client address that keeps sending wrong keys
// is answered 429 with Retry-After before its key is even looked at, while a valid key from
// another address is not slowed, and another address's first wrong key is still a 401.
func TestFailedAuthenticationsAreThrottled(t *testing.T) {
	url := "http://" + startServerWith(t, nil)
	attacker, user, other := clientFrom("127.0.0.2"), clientFrom("127.0.0.1"), clientFrom("127.0.0.3")
	codes := map[int]int{}
	var retry string
	for i := range 300 {
		st, ra, body := listModels(t, attacker, url, "tml-guess-"+strconv.Itoa(i))
		codes[st]++
		if st == http.StatusTooManyRequests {
			retry = ra
			require.Contains(t, body, "wrong API keys")
		}
	}
	require.Equal(t, 300, codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests], "%v", codes)
	require.LessOrEqual(t, codes[http.StatusUnauthorized], 20, "the attacker's wrong keys are mostly not even tried: %v", codes)
	n, err := strconv.Atoi(retry)
	require.NoError(t, err, "Retry-After %q", retry)
	require.Positive(t, n)

	// The throttled address gets 429 even with a valid key: its keys are not tried.
	st, _, _ := listModels(t, attacker, url, keyA)
	require.Equal(t, http.StatusTooManyRequests, st)
	// Another address: a valid key is served, a wrong one is a plain 401.
	st, _, body := listModels(t, user, url, keyA)
	require.Equal(t, http.StatusOK, st, body)
	st, _, body = listModels(t, other, url, "tml-typo")
	require.Equal(t, http.StatusUnauthorized, st, body)
}
