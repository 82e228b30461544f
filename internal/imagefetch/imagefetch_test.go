package imagefetch

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/vision"
)

// pngOf is a w×h PNG.
func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))))
	return buf.Bytes()
}

// server serves the test's images over TLS on 127.0.0.1 and returns a Fetcher allowed
// to fetch from it, and the base URL.
func server(t *testing.T, h http.Handler, o Options) (*Fetcher, string) {
	t.Helper()
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	o.Hosts = append(o.Hosts, strings.TrimPrefix(ts.URL, "https://"))
	o.Client = ts.Client()
	f, err := New(o)
	require.NoError(t, err)
	return f, ts.URL
}

func TestFetchesFromAllowedHostsOnly(t *testing.T) {
	pic := pngOf(t, 24, 16)
	var hits atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/a.png", func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); _, _ = w.Write(pic) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/a.png", http.StatusFound) })
	mux.HandleFunc("/missing", http.NotFound)
	mux.HandleFunc("/huge", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(make([]byte, vision.MaxBytes+10)) // chunked: no Content-Length up front
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	f, base := server(t, mux, Options{Timeout: 500 * time.Millisecond})
	fetch := f.ForRequest(context.Background())

	got, err := fetch(base + "/a.png")
	require.NoError(t, err)
	require.Equal(t, pic, got)

	for loc, want := range map[string]string{
		base + "/missing":                      "answered 404",
		base + "/moved":                        "redirect, which is not followed",
		base + "/huge":                         "over the limit of 8388608 bytes",
		"http" + base[5:] + "/a.png":           "must be an https URL",
		"https://example.com/a.png":            `host "example.com" is not one this server fetches images from`,
		"https://u:p@" + base[8:] + "/a":       "credentials",
		"/etc/passwd":                          "must be an https URL",
		"https://" + strings.Repeat("a", 3000): "over the 2048-byte limit",
	} {
		_, err := fetch(loc)
		require.ErrorContains(t, err, want, loc)
	}
	require.Equal(t, int32(1), hits.Load(), "refused locations are never requested")

	// The request's fetches share one deadline.
	start := time.Now()
	_, err = f.ForRequest(context.Background())(base + "/slow")
	require.ErrorContains(t, err, "no answer within")
	require.Less(t, time.Since(start), 4*time.Second)
}

func TestNoHostsFetchesNothing(t *testing.T) {
	f, err := New(Options{Hosts: []string{" ", ""}})
	require.NoError(t, err)
	require.Nil(t, f)
	require.Nil(t, f.ForRequest(context.Background()))
	_, err = f.Allowed("https://example.com/a.png")
	require.ErrorContains(t, err, "--image-fetch-hosts")
	for _, bad := range []string{"https://example.com", "example.com/x", "a b"} {
		_, err := New(Options{Hosts: []string{bad}})
		require.ErrorContains(t, err, "is not a host name", bad)
	}
}

// A fetch waits for a slot while others run, within its request's deadline.
func TestInFlightBound(t *testing.T) {
	release := make(chan struct{})
	var running, peak atomic.Int32
	f, base := server(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		_, _ = w.Write([]byte("x"))
	}), Options{InFlight: 2, Timeout: 5 * time.Second})
	done := make(chan error, 4)
	for range 4 {
		go func() { _, err := f.ForRequest(context.Background())(base + "/i"); done <- err }()
	}
	require.Eventually(t, func() bool { return running.Load() == 2 }, 5*time.Second, 10*time.Millisecond)
	close(release)
	for range 4 {
		require.NoError(t, <-done)
	}
	require.Equal(t, int32(2), peak.Load())
}

// FuzzAllowed: any location is either refused with a message or an https URL of the
// allowed host.
func FuzzAllowed(f *testing.F) {
	for _, s := range []string{"https://img.example:8443/a.png", "https://IMG.example:8443/x?y", "http://img.example:8443/", "https://img.example/", "//img.example:8443/a", "https://img.example:8443@evil/a", "file:///etc/passwd", "\x00"} {
		f.Add(s)
	}
	fe, err := New(Options{Hosts: []string{"img.example:8443"}})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, loc string) {
		u, err := fe.Allowed(loc)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		require.Equal(t, "https", u.Scheme)
		require.Equal(t, "img.example:8443", strings.ToLower(u.Host))
		require.Nil(t, u.User)
	})
}
