package ray

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/pools/poolstest"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// fakeRay serves the Jobs REST routes; a submitted job runs a Go stand-in for the Python
// pool driver (WatchPool, one fake worker per desired replica, restarted when killed, as Ray
// restarts an actor).
type fakeRay struct {
	t    *testing.T
	mu   sync.Mutex
	jobs map[string]*fakeJob
	reqs []string
	// lingering: after a DELETE, a submission of the same id is refused as existing this
	// many times (Ray frees a deleted job's id asynchronously).
	lingering int
	linger    map[string]int
}

type fakeJob struct {
	req    SubmitRequest
	status string
	cancel context.CancelFunc
	kill   map[int]context.CancelFunc
	mu     sync.Mutex
	logs   strings.Builder
}

func (f *fakeRay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, "/api/jobs/")
	id, action, _ := strings.Cut(path, "/")
	writeJSON := func(v any) { w.Header().Set("Content-Type", "application/json"); _ = json.NewEncoder(w).Encode(v) }
	f.mu.Lock()
	j := f.jobs[id]
	f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && path == "":
		var req SubmitRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Entrypoint == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		if f.linger[req.SubmissionID] > 0 {
			f.linger[req.SubmissionID]--
			f.mu.Unlock()
			http.Error(w, "Job with submission_id "+req.SubmissionID+" already exists", http.StatusBadRequest)
			return
		}
		if f.jobs[req.SubmissionID] != nil {
			f.mu.Unlock()
			http.Error(w, "Job with submission_id "+req.SubmissionID+" already exists", http.StatusBadRequest)
			return
		}
		j := &fakeJob{req: req, status: StatusRunning, kill: map[int]context.CancelFunc{}}
		f.jobs[req.SubmissionID] = j
		f.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		j.cancel = cancel
		go f.drive(ctx, j)
		writeJSON(map[string]string{"submission_id": req.SubmissionID})
	case j == nil:
		http.Error(w, "Job "+id+" does not exist", http.StatusNotFound)
	case r.Method == http.MethodGet && action == "":
		j.mu.Lock()
		defer j.mu.Unlock()
		writeJSON(JobInfo{SubmissionID: id, Entrypoint: j.req.Entrypoint, Status: j.status})
	case r.Method == http.MethodGet && action == "logs":
		j.mu.Lock()
		defer j.mu.Unlock()
		writeJSON(map[string]string{"logs": j.logs.String()})
	case r.Method == http.MethodPost && action == "stop":
		j.cancel()
		j.mu.Lock()
		stopped := !Terminal(j.status)
		if stopped {
			j.status = StatusStopped
		}
		j.mu.Unlock()
		writeJSON(map[string]bool{"stopped": stopped})
	case r.Method == http.MethodDelete && action == "":
		f.mu.Lock()
		delete(f.jobs, id)
		if f.lingering > 0 {
			if f.linger == nil {
				f.linger = map[string]int{}
			}
			f.linger[id] = f.lingering
		}
		f.mu.Unlock()
		writeJSON(map[string]bool{"deleted": true})
	default:
		http.Error(w, "no route", http.StatusNotFound)
	}
}

func (f *fakeRay) drive(ctx context.Context, j *fakeJob) {
	ep := j.req.Entrypoint
	i := strings.Index(ep, "--spec '")
	raw := strings.ReplaceAll(strings.TrimSuffix(ep[i+len("--spec '"):], "'"), `'\''`, "'")
	var spec DriverSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		f.t.Errorf("driver spec %q: %v", raw, err)
		return
	}
	env := j.req.RuntimeEnv["env_vars"].(map[string]any)
	token := env[JoinTokenEnv].(string)
	creds, err := mtls.FromPEM([]byte(env[mtls.EnvCert].(string)), []byte(env[mtls.EnvKey].(string)), []byte(env[mtls.EnvCA].(string)))
	if err != nil {
		f.t.Errorf("the driver's credentials: %v", err)
		return
	}
	rcfg, err := creds.RegistryDialConfig()
	if err != nil {
		f.t.Errorf("the driver's credentials: %v", err)
		return
	}
	hc := mtls.HTTPClient(rcfg)
	defer hc.CloseIdleConnections()
	cl := backendv1connect.NewRegistryServiceClient(hc, spec.RegistryURL, connect.WithGRPC())
	var wg sync.WaitGroup
	defer func() {
		j.mu.Lock()
		for _, k := range j.kill {
			k()
		}
		if j.status == StatusRunning {
			j.status = StatusSucceeded
		}
		j.mu.Unlock()
		wg.Wait()
	}()
	actors := map[int]context.CancelFunc{}
	// Like ray_pool.follow: a stream that ends or breaks is opened again (the gateway may be
	// restarting; its replicas keep serving), until the gateway says the pool is gone or
	// refuses the driver.
	for ctx.Err() == nil {
		st, err := cl.WatchPool(ctx, &backendv1.WatchPoolRequest{PoolId: spec.Pool.ID, JoinToken: token})
		if err == nil {
			for st.Receive() {
				f.follow(ctx, j, &spec, token, creds, hc, actors, &wg, int(st.Msg().GetDesiredReplicas()))
			}
			err = st.Err()
		}
		switch connect.CodeOf(err) {
		case connect.CodeNotFound, connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeInvalidArgument:
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// follow starts or stops the fake driver's actors for n desired replicas.
func (f *fakeRay) follow(ctx context.Context, j *fakeJob, spec *DriverSpec, token string, creds *mtls.Credentials, hc *http.Client, actors map[int]context.CancelFunc, wg *sync.WaitGroup, n int) {
	fmt.Fprintf(&j.logs, "desired %d\n", n)
	for r, stop := range actors {
		if r >= n {
			stop()
			delete(actors, r)
		}
	}
	for r := range n {
		if actors[r] != nil {
			continue
		}
		actx, stop := context.WithCancel(ctx)
		actors[r] = stop
		wg.Add(1)
		go func() { // an actor: restarted whenever it dies, until stopped
			defer wg.Done()
			for actx.Err() == nil {
				w, err := poolstest.StartFakeWorker(spec.ListenHost+":0", []string{spec.Pool.BaseModel}, creds)
				if err != nil {
					return
				}
				lctx, die := context.WithCancel(actx)
				j.mu.Lock()
				j.kill[r] = die
				j.mu.Unlock()
				_ = pools.Hold(lctx, hc, spec.RegistryURL, &backendv1.RegisterRequest{PoolId: spec.Pool.ID, Replica: uint32(r),
					Address: w.Addr, IncarnationId: fmt.Sprintf("actor-%d-%d", r, time.Now().UnixNano()), JoinToken: token})
				w.Close()
				die()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
}

func (f *fakeRay) killActor(pool string, r int) {
	f.mu.Lock()
	j := f.jobs[JobID(pool)]
	f.mu.Unlock()
	j.mu.Lock()
	k := j.kill[r]
	j.mu.Unlock()
	k()
}

func newProvider(t *testing.T) (*Provider, *pools.Registry, *fakeRay) {
	a := poolstest.Authority(t)
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "tok'en", HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: time.Second})
	srv, err := pools.Serve(reg, "127.0.0.1:0", a.RegistryConfig())
	require.NoError(t, err)
	fr := &fakeRay{t: t, jobs: map[string]*fakeJob{}}
	hs := httptest.NewServer(fr)
	p, err := New(Options{Client: NewClient(hs.URL, nil, nil), Registry: reg, RegistryURL: srv.URL(), JoinToken: "tok'en", Authority: a, MonitorInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, id := range reg.Pools() {
			_ = p.DeletePool(context.Background(), id)
		}
		require.NoError(t, p.Close())
		reg.Close()
		_ = srv.Close()
		hs.Close()
	})
	return p, reg, fr
}

func TestContract(t *testing.T) {
	poolstest.Run(t, func(t *testing.T) *poolstest.Harness {
		p, reg, fr := newProvider(t)
		return &poolstest.Harness{Provider: p, Registry: reg, Authority: p.opts.Authority, MaxReplicas: 4,
			Spec: func(id string) pools.Spec {
				return pools.Spec{ID: id, Role: pools.RoleTrainer, BaseModel: "loops/tiny", GPUsPerReplica: 1}
			},
			Kill: func(t *testing.T, pool string, r int) { fr.killActor(pool, r) }}
	})
}

// A driver job that ends while its pool should exist is submitted again, also while the
// cluster still holds the deleted job's id; the job request carries the spec, the token and
// the metadata.
func TestResubmit(t *testing.T) {
	p, reg, fr := newProvider(t)
	ctx := t.Context()
	require.NoError(t, p.EnsurePool(ctx, pools.Spec{ID: "r", Role: pools.RoleSampler, BaseModel: "m", Replicas: 1}))
	require.Eventually(t, func() bool { return len(reg.Members("r")) == 1 }, 10*time.Second, 20*time.Millisecond)
	fr.mu.Lock()
	j := fr.jobs[JobID("r")]
	fr.mu.Unlock()
	require.Equal(t, "r", j.req.Metadata["loops_pool"])
	require.Contains(t, j.req.Entrypoint, "-m loops_worker.ray_pool --spec ")
	require.Contains(t, j.req.Entrypoint, `"listen_host":"127.0.0.1"`, "actors listen on their node's loopback unless told otherwise")
	for _, secret := range []string{"tok'en", "PRIVATE KEY"} {
		require.NotContains(t, j.req.Entrypoint, secret, "secrets go in the job's environment, never on its command line")
	}
	fr.mu.Lock()
	fr.lingering = 8 // the cluster still holds the deleted job's id for a while
	fr.mu.Unlock()
	j.cancel() // the driver dies
	require.Eventually(t, func() bool {
		fr.mu.Lock()
		defer fr.mu.Unlock()
		return fr.jobs[JobID("r")] != nil && fr.jobs[JobID("r")] != j
	}, 10*time.Second, 20*time.Millisecond, "resubmitted")
	require.Eventually(t, func() bool { return len(reg.Members("r")) == 1 }, 10*time.Second, 20*time.Millisecond)
	fr.mu.Lock()
	require.Contains(t, strings.Join(fr.reqs, ","), "DELETE /api/jobs/loops-pool-r")
	fr.mu.Unlock()
}

func TestClientErrors(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Traceback ...\nValueError: bad runtime_env", http.StatusBadRequest)
	}))
	defer hs.Close()
	c := NewClient(hs.URL, nil, http.Header{"Authorization": {"Bearer x"}})
	_, err := c.Submit(t.Context(), SubmitRequest{Entrypoint: "x"})
	require.ErrorContains(t, err, "HTTP 400")
	require.ErrorContains(t, err, "bad runtime_env")
	_, err = NewClient("http://127.0.0.1:1", nil, nil).Job(t.Context(), "x")
	require.ErrorContains(t, err, "ray dashboard")
}

// TestSubmitErrorsHideSecrets: a dashboard whose refusal quotes the job's runtime_env
// (the join token, the workers' key and certificate) shows none of them in the error.
func TestSubmitErrorsHideSecrets(t *testing.T) {
	var body string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		http.Error(w, "invalid runtime_env: "+strings.ReplaceAll(body, "\n", " "), http.StatusBadRequest)
	}))
	defer hs.Close()
	reg := pools.NewRegistry(pools.RegistryOptions{JoinToken: "a-join-token-value"})
	p, err := New(Options{Client: NewClient(hs.URL, nil, nil), Registry: reg, RegistryURL: "https://127.0.0.1:1", JoinToken: "a-join-token-value", Authority: poolstest.Authority(t)})
	require.NoError(t, err)
	err = p.EnsurePool(t.Context(), pools.Spec{ID: "x", Role: pools.RoleTrainer, BaseModel: "m", Replicas: 1})
	require.ErrorContains(t, err, "HTTP 400")
	require.Contains(t, body, "a-join-token-value", "the dashboard got the token")
	require.NotContains(t, err.Error(), "a-join-token-value")
	var sent SubmitRequest
	require.NoError(t, json.Unmarshal([]byte(body), &sent))
	key := sent.RuntimeEnv["env_vars"].(map[string]any)[mtls.EnvKey].(string)
	for line := range strings.SplitSeq(strings.TrimSpace(key), "\n") {
		if !strings.HasPrefix(line, "-----") {
			require.NotContains(t, err.Error(), line, "a line of the workers' key")
		}
	}
}

// A gateway that starts again adopts its running driver, and replaces one submitted with
// another spec (another registry URL).
func TestAdoptOrReplace(t *testing.T) {
	p, reg, fr := newProvider(t)
	ctx := t.Context()
	spec := pools.Spec{ID: "a", Role: pools.RoleSampler, BaseModel: "m", Replicas: 1}
	require.NoError(t, p.EnsurePool(ctx, spec))
	fr.mu.Lock()
	j := fr.jobs[JobID("a")]
	fr.mu.Unlock()
	require.NoError(t, p.Close()) // the first gateway is gone
	p2, err := New(Options{Client: p.opts.Client, Registry: reg, RegistryURL: p.opts.RegistryURL, JoinToken: p.opts.JoinToken, Authority: p.opts.Authority})
	require.NoError(t, err)
	require.NoError(t, p2.EnsurePool(ctx, spec))
	fr.mu.Lock()
	require.Same(t, j, fr.jobs[JobID("a")], "the same spec adopts the running job")
	fr.mu.Unlock()
	require.NoError(t, p2.Close())
	p3, err := New(Options{Client: p.opts.Client, Registry: reg, RegistryURL: p.opts.RegistryURL + "/other", JoinToken: p.opts.JoinToken, Authority: p.opts.Authority})
	require.NoError(t, err)
	require.NoError(t, p3.EnsurePool(ctx, spec))
	defer func() { require.NoError(t, p3.DeletePool(ctx, "a")); require.NoError(t, p3.Close()) }()
	fr.mu.Lock()
	j3 := fr.jobs[JobID("a")]
	fr.mu.Unlock()
	require.NotSame(t, j, j3, "another spec replaces the job")
	require.Contains(t, j3.req.Entrypoint, "/other")
	j.mu.Lock()
	require.Equal(t, StatusStopped, j.status)
	j.mu.Unlock()
}
