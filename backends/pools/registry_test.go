package pools_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/poolstest"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

func serve(t *testing.T, o pools.RegistryOptions) (*pools.Registry, backendv1connect.RegistryServiceClient) {
	reg, cl, _ := serveURL(t, o)
	return reg, cl
}

// registryClient is the HTTP client of a worker of the test's gateway (set by serveURL).
var registryClient *http.Client

func serveURL(t *testing.T, o pools.RegistryOptions) (*pools.Registry, backendv1connect.RegistryServiceClient, string) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(o)
	srv, err := pools.Serve(reg, "127.0.0.1:0", a.RegistryConfig())
	require.NoError(t, err)
	t.Cleanup(func() { reg.Close(); _ = srv.Close() })
	registryClient = poolstest.RegistryClient(t, a)
	return reg, backendv1connect.NewRegistryServiceClient(registryClient, srv.URL(), connect.WithGRPC()), srv.URL()
}

// TestRegistryIsTLSOnly: the Registry serves TLS only (a plaintext client gets nothing),
// with the gateway's certificate (a worker of another gateway does not send it its token),
// and refuses to start without a certificate.
func TestRegistryIsTLSOnly(t *testing.T) {
	_, err := pools.Serve(pools.NewRegistry(pools.RegistryOptions{}), "127.0.0.1:0", nil)
	require.ErrorContains(t, err, "TLS only")
	_, _, url := serveURL(t, pools.RegistryOptions{JoinToken: "tok"})
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: p}}
	plain := backendv1connect.NewRegistryServiceClient(h2c, strings.Replace(url, "https://", "http://", 1), connect.WithGRPC())
	_, err = plain.Register(t.Context(), req("p", 0, "a"))
	require.Error(t, err)
	require.NotEqual(t, connect.CodeUnauthenticated, connect.CodeOf(err), "the registry never saw the call")
	other := backendv1connect.NewRegistryServiceClient(poolstest.RegistryClient(t, poolstest.Authority(t)), url, connect.WithGRPC())
	_, err = other.Register(t.Context(), req("p", 0, "a"))
	require.ErrorContains(t, err, "certificate", "another gateway's worker does not trust this registry")
}

func req(pool string, replica uint32, inc string) *backendv1.RegisterRequest {
	return &backendv1.RegisterRequest{PoolId: pool, Replica: replica, Address: "127.0.0.1:7001", IncarnationId: inc, JoinToken: "tok"}
}

func TestRegisterAuthAndValidation(t *testing.T) {
	ctx := t.Context()
	_, off := serve(t, pools.RegistryOptions{})
	_, err := off.Register(ctx, req("p", 0, "a"))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "no token configured: registration is off")

	_, cl := serve(t, pools.RegistryOptions{JoinToken: "tok", MaxRegistrations: 2})
	bad := req("p", 0, "a")
	bad.JoinToken = "tok2"
	_, err = cl.Register(ctx, bad)
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err))
	for name, mut := range map[string]func(*backendv1.RegisterRequest){
		"pool":     func(r *backendv1.RegisterRequest) { r.PoolId = "a/b" },
		"replica":  func(r *backendv1.RegisterRequest) { r.Replica = pools.MaxReplicas },
		"address":  func(r *backendv1.RegisterRequest) { r.Address = "nohost" },
		"wildcard": func(r *backendv1.RegisterRequest) { r.Address = "0.0.0.0:7001" },
		"port":     func(r *backendv1.RegisterRequest) { r.Address = "h:0" },
		"inc":      func(r *backendv1.RegisterRequest) { r.IncarnationId = "" },
		"inc sp":   func(r *backendv1.RegisterRequest) { r.IncarnationId = "a b" },
		"gpus":     func(r *backendv1.RegisterRequest) { r.Gpus = 65 },
	} {
		r := req("p", 0, "a")
		mut(r)
		_, err := cl.Register(ctx, r)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), name)
	}
	r1, err := cl.Register(ctx, req("p", 0, "a"))
	require.NoError(t, err)
	again, err := cl.Register(ctx, req("p", 0, "a"))
	require.NoError(t, err)
	require.Equal(t, r1.GetLeaseId(), again.GetLeaseId(), "the same incarnation again is idempotent")
	_, err = cl.Register(ctx, req("p", 1, "b"))
	require.NoError(t, err)
	_, err = cl.Register(ctx, req("p", 2, "c"))
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "registrations are bounded")
	_, err = cl.Register(ctx, req("p", 1, "b2"))
	require.NoError(t, err, "a new incarnation of a registered replica replaces it within the bound")
}

func TestHeartbeatLossAndIncarnations(t *testing.T) {
	ctx := t.Context()
	// The timeout is long enough that a loaded machine (the race detector, parallel packages)
	// never delays one beat past it.
	const timeout = time.Second
	reg, cl, url := serveURL(t, pools.RegistryOptions{JoinToken: "tok", HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: timeout})
	reg.SetDesired("p", 2)
	ev := reg.Watch(ctx, "p")
	// registered but never beating: lost after the timeout
	_, err := cl.Register(ctx, req("p", 0, "a"))
	require.NoError(t, err)
	require.Equal(t, pools.Up, (<-ev).Kind)
	lost := <-ev
	require.Equal(t, pools.Lost, lost.Kind)
	require.Contains(t, lost.Reason, "no heartbeat")

	// beating keeps it; a new incarnation replaces it and ends the old stream with NotFound
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := req("p", 1, "x")
	resp, err := cl.Register(ctx, r)
	require.NoError(t, err)
	st, err := cl.Heartbeat(hctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&backendv1.HeartbeatRequest{LeaseId: resp.GetLeaseId()}))
	_, err = st.Receive()
	require.NoError(t, err)
	require.Equal(t, pools.Up, (<-ev).Kind)
	for start := time.Now(); time.Since(start) < timeout*3/2; { // still registered past the timeout because it beats
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, st.Send(&backendv1.HeartbeatRequest{}))
		_, err = st.Receive()
		require.NoError(t, err)
	}
	require.Len(t, reg.Members("p"), 1)
	_, err = cl.Register(ctx, req("p", 1, "y"))
	require.NoError(t, err)
	l, u := <-ev, <-ev
	require.Equal(t, pools.Lost, l.Kind)
	require.Equal(t, "x", l.Incarnation)
	require.Equal(t, pools.Up, u.Kind)
	require.Equal(t, "y", u.Incarnation)
	for {
		if _, err = st.Receive(); err != nil {
			break
		}
	}
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "the replaced lease's stream ends")

	// beyond the desired size: refused; scaled below a replica: drained
	_, err = cl.Register(ctx, req("p", 2, "z"))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	r0 := req("p", 0, "d")
	errc := make(chan error, 1)
	go func() { errc <- pools.Hold(hctx, registryClient, url, r0) }()
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 2 }, 5*time.Second, 10*time.Millisecond)
	reg.SetDesired("p", 0)
	select {
	case err := <-errc:
		require.ErrorIs(t, err, pools.ErrDrain)
	case <-time.After(5 * time.Second):
		t.Fatal("not drained")
	}
}

func TestWatchPool(t *testing.T) {
	ctx := t.Context()
	reg, cl := serve(t, pools.RegistryOptions{JoinToken: "tok"})
	_, err := cl.WatchPool(ctx, &backendv1.WatchPoolRequest{PoolId: "p", JoinToken: "bad"})
	require.NoError(t, err)
	reg.SetDesired("p", 1)
	st, err := cl.WatchPool(ctx, &backendv1.WatchPoolRequest{PoolId: "p", JoinToken: "tok"})
	require.NoError(t, err)
	require.True(t, st.Receive())
	require.EqualValues(t, 1, st.Msg().GetDesiredReplicas())
	reg.SetDesired("p", 3)
	require.True(t, st.Receive())
	require.EqualValues(t, 3, st.Msg().GetDesiredReplicas())
	reg.DropPool("p", "deleted")
	require.False(t, st.Receive())
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(st.Err()))
	bad, err := cl.WatchPool(ctx, &backendv1.WatchPoolRequest{PoolId: "p", JoinToken: "bad"})
	require.NoError(t, err)
	require.False(t, bad.Receive())
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(bad.Err()))
}

// FuzzRegister: any registration is answered with a clear code, never a panic, and the
// registry stays bounded.
func FuzzRegister(f *testing.F) {
	f.Add("p", uint32(0), "127.0.0.1:1", "inc", "tok", uint32(0))
	f.Add("", uint32(1<<31), "[::1]:65535", "a b", "x", uint32(99))
	f.Add("p.q-r_s", uint32(1023), "host:99999", "\x00", "tok", uint32(64))
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "tok", MaxRegistrations: 4, HeartbeatTimeout: time.Hour})
	defer reg.Close()
	f.Fuzz(func(t *testing.T, pool string, replica uint32, addr, inc, tok string, gpus uint32) {
		_, err := reg.Register(t.Context(), &backendv1.RegisterRequest{PoolId: pool, Replica: replica, Address: addr, IncarnationId: inc, JoinToken: tok, Gpus: gpus})
		if err != nil {
			require.Contains(t, []connect.Code{connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodeResourceExhausted}, connect.CodeOf(err), err.Error())
			return
		}
		require.NoError(t, pools.ValidateRegister(&backendv1.RegisterRequest{PoolId: pool, Replica: replica, Address: addr, IncarnationId: inc, Gpus: gpus}))
		n := 0
		for _, p := range reg.Pools() {
			n += len(reg.Members(p))
		}
		require.LessOrEqual(t, n, 4)
	})
}

// Deleting a pool drains its workers (they stop instead of registering again).
func TestDropPoolDrains(t *testing.T) {
	reg, _, url := serveURL(t, pools.RegistryOptions{JoinToken: "tok", HeartbeatInterval: 50 * time.Millisecond})
	reg.SetDesired("p", 1)
	errc := make(chan error, 1)
	go func() { errc <- pools.Hold(t.Context(), registryClient, url, req("p", 0, "a")) }()
	require.Eventually(t, func() bool { return len(reg.Members("p")) == 1 }, 5*time.Second, 10*time.Millisecond)
	reg.DropPool("p", "deleted")
	select {
	case err := <-errc:
		require.ErrorIs(t, err, pools.ErrDrain)
	case <-time.After(5 * time.Second):
		t.Fatal("a worker of a deleted pool kept its registration")
	}
	require.Empty(t, reg.Members("p"))
}

// A heartbeat stream that names no lease is closed after the heartbeat timeout.
func TestHeartbeatWithoutLease(t *testing.T) {
	_, cl := serve(t, pools.RegistryOptions{JoinToken: "tok", HeartbeatTimeout: 200 * time.Millisecond})
	st, err := cl.Heartbeat(t.Context())
	require.NoError(t, err)
	_, err = st.Receive()
	require.Equal(t, connect.CodeDeadlineExceeded, connect.CodeOf(err))
	st2, err := cl.Heartbeat(t.Context())
	require.NoError(t, err)
	require.NoError(t, st2.Send(&backendv1.HeartbeatRequest{LeaseId: "nope"}))
	_, err = st2.Receive()
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}
