package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/lease"
)

// heldLease is a lease.Store whose lease another gateway holds for an hour.
type heldLease struct{ addr string }

func (h heldLease) record() lease.Record {
	now := time.Now()
	return lease.Record{Name: lease.DefaultName, Holder: "leader", Address: h.addr, Term: 1,
		AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(time.Hour), Now: now}
}

func (h heldLease) TryAcquire(context.Context, string, string, string, time.Duration) (lease.Record, bool, error) {
	return h.record(), false, nil
}

func (h heldLease) Renew(context.Context, string, string, int64, time.Duration) (lease.Record, error) {
	return lease.Record{}, lease.ErrLost
}
func (h heldLease) Release(context.Context, string, string, int64) error { return nil }
func (h heldLease) Get(context.Context, string) (lease.Record, error)    { return h.record(), nil }

// FuzzStandbyForward: whatever request a standby gets, it forwards it to the leader (whose
// answer comes back) or answers 503 NO_LEADER; it never panics, never forwards a request
// another gateway forwarded, and the leader sees the client's method, path, Host and body.
func FuzzStandbyForward(f *testing.F) {
	f.Add("POST", "/api/v1/forward_backward", "", []byte(`{"model_id":"m"}`), "127.0.0.1:8000")
	f.Add("GET", "/v1/training_runs?limit=3", "", []byte(nil), "localhost")
	f.Add("GET", "/healthz", "g2", []byte(nil), "localhost")
	f.Add("DELETE", "/%2e%2e/x", "", []byte("x"), "evil.example")
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-By", r.Header.Get(forwardedHeader))
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(body)
	}))
	defer leader.Close()
	log := slog.New(slog.DiscardHandler)
	el, err := lease.New(lease.Config{Store: heldLease{addr: leader.URL}, Holder: "standby", Address: "http://standby", Logger: log})
	require.NoError(f, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = el.Run(ctx) }()
	require.Eventually(f, func() bool { return el.Status().Address == leader.URL }, 10*time.Second, time.Millisecond)
	fo := &failover{cfg: LeaseConfig{Holder: "standby"}, elector: el, proxy: newProxy(log, "standby")}

	f.Fuzz(func(t *testing.T, method, target, by string, body []byte, host string) {
		req, err := http.NewRequest(method, "http://standby"+target, bytes.NewReader(body))
		if err != nil || req.URL.Path == "" || req.URL.Path[0] != '/' {
			return
		}
		req.Host = host
		if by != "" {
			req.Header.Set(forwardedHeader, by)
			if req.Header.Get(forwardedHeader) == "" {
				return
			}
		}
		rec := httptest.NewRecorder()
		fo.forward(rec, req)
		switch rec.Code {
		case http.StatusTeapot:
			require.Empty(t, req.Header.Get(forwardedHeader), "a forwarded request is not forwarded again")
			want := method
			if want == "" {
				want = http.MethodGet // net/http's meaning of an empty method
			}
			require.Equal(t, want, rec.Header().Get("X-Method"))
			require.Equal(t, "standby", rec.Header().Get("X-By"))
			if method != http.MethodHead {
				require.Equal(t, string(body), rec.Body.String())
			}
		case http.StatusServiceUnavailable:
			require.Equal(t, "true", rec.Header().Get("x-should-retry"))
			require.Contains(t, rec.Body.String(), "NO_LEADER")
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
