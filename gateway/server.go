package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/compat"
	"github.com/loops-dev/loops/compat/anthropic"
	"github.com/loops-dev/loops/compat/inference"
	"github.com/loops-dev/loops/compat/openai"
	"github.com/loops-dev/loops/gateway/access"
	"github.com/loops-dev/loops/gateway/audit"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/auth/keysvc"
	"github.com/loops-dev/loops/gateway/ckhttp"
	"github.com/loops-dev/loops/gateway/console"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/jobs"
	"github.com/loops-dev/loops/gateway/opsvc"
	"github.com/loops-dev/loops/gateway/poolsvc"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/bounded"
	"github.com/loops-dev/loops/internal/imagefetch"
	"github.com/loops-dev/loops/internal/telemetry"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// Limits are the request limits of every surface. Zero values take the defaults.
type Limits struct {
	// MaxBodyBytes caps a request body as sent, and a loops.v1 message (Connect, gRPC,
	// gRPC-Web, REST) after decompression too (default compat.DefaultMaxBodyBytes, 64 MiB).
	MaxBodyBytes int64
	// MaxDecompressedBytes caps a Tinker body after zstd decompression (default
	// compat.DefaultMaxDecompressedBytes, 256 MiB).
	MaxDecompressedBytes int64
	// DecompressBudgetBytes bounds the memory of compressed bodies being decompressed, or
	// held decompressed, across the server at once, every surface together. A body reserves
	// what its decompression allocates before anything is allocated, until that memory has
	// been garbage collected, and waits up to compat.DecompressWait for room, then gets a
	// 429 (see internal/bounded). Default MaxDecompressedBytes: one maximal body at a time,
	// or many small ones.
	DecompressBudgetBytes int64
	// BodyReadTimeout is how long a request body has to arrive once its headers have
	// (default DefaultBodyReadTimeout, 60 s).
	BodyReadTimeout time.Duration
	// MaxRequestsPerKey caps the requests one API key has in flight; one more is a 429
	// with the reason (default auth.DefaultMaxRequestsPerKey; negative: no cap).
	MaxRequestsPerKey int
	// LongPoll is how long Tinker's retrieve_future holds a pending operation before it
	// answers try_again with the operation's queue state (default 25 s, under the SDK's
	// 45 s read timeout).
	LongPoll time.Duration
}

// withDefaults fills in the documented defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = compat.DefaultMaxBodyBytes
	}
	if l.MaxDecompressedBytes <= 0 {
		l.MaxDecompressedBytes = compat.DefaultMaxDecompressedBytes
	}
	if l.DecompressBudgetBytes <= 0 {
		l.DecompressBudgetBytes = l.MaxDecompressedBytes
	}
	if l.BodyReadTimeout <= 0 {
		l.BodyReadTimeout = DefaultBodyReadTimeout
	}
	return l
}

// Config configures a server.
type Config struct {
	// DataDir holds the database, checkpoints and built-in models.
	DataDir string
	// Store, when set, keeps the server's records instead of the SQLite database
	// DataDir/loops.db (for example a store/postgres.Store). The server closes it, also when
	// New fails.
	Store store.Store
	// Backend is the registered backend's name (default "reference").
	Backend string
	// BackendConfig is passed to the backend factory; its DataDir defaults to DataDir.
	BackendConfig backends.Config
	// Keys are the accepted API keys; nil or empty is open mode (loopback only).
	Keys *auth.Keys
	// Core configures sessions, queues and retention.
	Core core.Options
	// Limits are the request size limits.
	Limits Limits
	// Logger receives the server's logs (default slog.Default()).
	Logger *slog.Logger
	// Lease, when set, makes this gateway one of several on a shared database: it runs
	// the core only while it holds the leader lease and forwards to the leader otherwise
	// (standby.go, docs/two-gateways.md). Nil: the only gateway (SQLite), always leader.
	Lease *LeaseConfig
	// Jobs configures managed jobs (jobs.go).
	Jobs JobsConfig
	// Transfers bounds checkpoint downloads, exports and imports (gateway/ckhttp): slots
	// per server and per workspace, the minimum transfer rate. Its DataDir is DataDir.
	Transfers ckhttp.Options
	// AuthThrottle bounds the wrong API keys a client address (and all of them together)
	// may send, on the API and the console's sign-in alike (auth.Throttle).
	AuthThrottle auth.ThrottleOptions
	// TrustedProxies are the reverse proxies in front of the server: only from them are
	// X-Forwarded-For (the client address the throttle counts) and X-Forwarded-Proto
	// (https makes the console's cookie Secure) believed.
	TrustedProxies auth.TrustedProxies
	// ImageFetcher fetches the images Tinker's image_asset_pointer chunks name, from the
	// hosts the operator allows (loops serve --image-fetch-hosts); nil: such chunks are
	// refused.
	ImageFetcher *imagefetch.Fetcher
	// Audit tunes the audit log (gateway/audit): retention, the per-workspace cap, the
	// write buffer. Its Logger and Registerer are the server's.
	Audit audit.Options
	// APIKeys configures the API keys kept as records and the access tokens (JWTs) keys are
	// exchanged for (docs/security.md).
	APIKeys APIKeysConfig
	// DrainDelay is how long Close keeps serving once the health says NOT_SERVING (gRPC
	// health, /readyz), before the core drains and the listener closes (gateway/ops.go).
	DrainDelay time.Duration
	// HealthProbeEvery is how often the health probes the stores (default
	// opsvc.DefaultProbeEvery).
	HealthProbeEvery time.Duration
	// Access configures access requests and grants (gateway/access, docs/access.md): the
	// operator's webhook, the bound on pending requests, the sweep. Its Store, Policy,
	// Models and Logger are the server's.
	Access access.Options
}

// APIKeysConfig configures stored API keys and access tokens. The zero value gives the
// defaults of package auth, with JWT auth on.
type APIKeysConfig struct {
	// Cache tunes the cache of stored-key lookups (its TTL bounds how long a revocation
	// made on another gateway takes to reach this one).
	Cache auth.DirectoryOptions
	// Tokens tunes the access tokens: lifetime and signing-key rotation.
	Tokens auth.TokenOptions
	// DisableJWTAuth tells tinker SDKs (client/config's pjwt_auth_enabled) to send the API
	// key on every request instead of exchanging it for tokens; whoami then fails in the SDK.
	DisableJWTAuth bool
}

// Server is a running Loops server.
type Server struct {
	cfg Config
	log *slog.Logger
	// mu guards core and closers, which a standby sets when it takes over.
	mu      sync.Mutex
	core    *core.Core
	closers []func() error
	// fo is the lease and the forwarding to the leader (nil without Config.Lease).
	fo   *failover
	http *http.Server
	ln   net.Listener
	conn *grpc.ClientConn
	// store keeps the records; /healthz pings it.
	store store.Store
	// budget bounds the bytes being decompressed across every surface.
	budget *bounded.Budget
	// jobs runs managed jobs (guarded by mu; nil while a standby); jobsLn carries their
	// connections to http, next to ln (guarded by mu, made once).
	jobs   *jobs.Service
	jobsLn *jobs.Listener
	// infer is the sampling engine the OpenAI- and Anthropic-compatible APIs share
	// (guarded by mu).
	infer *inference.Engine
	// backend is the opened backend; PoolService shows and scales its pools.
	backend backends.Backend
	// throttle counts wrong API keys per client address, for every surface.
	throttle *auth.Throttle
	// ops is the health that grpc.health.v1, /livez and /readyz report (gateway/ops.go).
	ops *opsvc.Health
	// storeMetrics are the store probes' outcomes (opsmetrics.go).
	storeMetrics *storeMetrics
}

// New opens the store and the backend, starts the core and builds the handler for ln. Call
// Serve to start answering and Close to stop.
func New(ctx context.Context, ln net.Listener, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		if cfg.Store != nil {
			_ = cfg.Store.Close()
		}
		return nil, errors.New("gateway: DataDir is required")
	}
	if cfg.Backend == "" {
		cfg.Backend = "reference"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln,
		budget:   bounded.NewBudget(cfg.Limits.DecompressBudgetBytes, compat.DecompressWait),
		throttle: auth.NewThrottle(cfg.AuthThrottle), storeMetrics: newStoreMetrics()}
	ok := false
	defer func() {
		if !ok {
			_ = s.closeAll()
		}
	}()

	st := cfg.Store
	if st == nil {
		sq, err := sqlite.Open(ctx, cfg.DataDir+"/loops.db")
		if err != nil {
			return nil, err
		}
		st = sq
	}
	s.closers = append(s.closers, st.Close)
	s.store = st
	keyCache := cfg.APIKeys.Cache
	if keyCache.Logger == nil {
		keyCache.Logger = cfg.Logger
	}
	s.cfg.Keys = cfg.Keys.WithRecords(auth.NewDirectory(st, keyCache), auth.NewTokens(st, cfg.APIKeys.Tokens))
	s.startOps(ctx)

	bcfg := cfg.BackendConfig
	if bcfg.DataDir == "" {
		bcfg.DataDir = cfg.DataDir
	}
	be, err := backends.Open(ctx, cfg.Backend, bcfg)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, be.Close)
	s.backend = be

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerStoreMetrics(reg, st)
	s.registerOpsMetrics(reg)
	copts := cfg.Core
	copts.DataDir = cfg.DataDir
	copts.Logger = cfg.Logger
	copts.Registerer = reg
	var handler http.Handler
	if cfg.Lease != nil {
		if cfg.Lease.Address == "" {
			return nil, errNoLeaseAddress
		}
		handler, err = s.standby(ctx, reg, st, be, copts)
	} else {
		handler, err = s.lead(ctx, reg, st, be, copts)
	}
	if err != nil {
		return nil, err
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s.http = &http.Server{
		// Every surface continues its client's trace (OTEL_*; nothing with tracing off).
		Handler: telemetry.Handler(handler, telemetry.HTTPOptions{
			SecretPrefixes: []string{core.TracePathPrefix, ckhttp.ArchivePrefix},
			Untraced:       append([]string{"/metrics", "/healthz"}, opsvc.ProbePaths...),
		}),
		Protocols:         protocols,
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: bodies get their own deadline (see
		// withBodyReadDeadline) and responses may be long-polls or large downloads.
		IdleTimeout: idleTimeout,
		ErrorLog:    slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	ok = true
	return s, nil
}

// Core returns the server's core (for in-process callers such as benchmarks); nil while
// the server is a standby.
func (s *Server) Core() *core.Core { return s.leaderCore() }

// Serve answers requests until Close.
func (s *Server) Serve() error {
	go func() { _ = s.http.Serve(s.jobsListener()) }()
	if err := s.http.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close shuts the server down in order, within the context's deadline (the grace): the
// core drains (new work refused, queued work failed with Unavailable, long-polls answered
// at once, so Tinker clients hear try_again), the listener stops accepting and requests in
// flight finish, running backend calls finish, then the core, the backend and the store
// close, each once. A second Close does nothing more.
func (s *Server) Close(ctx context.Context) error {
	s.drainOps(ctx)
	s.closingLease()
	c := s.leaderCore()
	if c != nil {
		c.Drain(ctx)
	}
	s.closeJobs(ctx)
	err := s.http.Shutdown(ctx)
	if err != nil {
		// The grace ended with connections still busy (a body trickling in, a stream):
		// they are closed now rather than left to outlive Close.
		s.log.Warn("connections still open at the end of the grace period are closed", slog.Any("err", err))
		_ = s.http.Close()
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
	if c != nil {
		if werr := c.WaitIdle(ctx); werr != nil {
			s.log.Warn("backend calls still running at the end of the grace period are cancelled", slog.Any("err", werr))
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, s.closeAll())
}

func (s *Server) closeAll() error {
	s.mu.Lock()
	closers := s.closers
	s.closers = nil
	s.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if i == 0 {
			// The core has committed everything: a lease held is released now, so that a
			// standby takes over at once. The store closes last.
			s.stopLease()
		}
		errs = append(errs, closers[i]())
	}
	if len(closers) == 0 {
		s.stopLease()
	}
	return errors.Join(errs...)
}

// compressMinBytes is the smallest Connect response that is compressed (when the client
// accepts gzip).
const compressMinBytes = 4096

// publicPaths need no API key.
var publicPaths = append([]string{"/healthz", "/metrics", "/openapi.json", "/api/v1/healthz", ckhttp.ArchivePrefix, core.TracePathPrefix}, opsvc.PublicPaths...)

func (s *Server) handler(ctx context.Context, reg *prometheus.Registry) (http.Handler, error) {
	svc := s.core.Services()
	mux := http.NewServeMux()
	edge := newEdge(s.log, reg)

	keys := s.cfg.Keys
	if keys == nil {
		keys = &auth.Keys{}
	}
	policy := auth.Policy{MaxRequestsPerKey: s.cfg.Limits.MaxRequestsPerKey,
		Throttle: s.throttle, Proxies: s.cfg.TrustedProxies,
		ErrorShapes: []auth.ErrorShape{
			{Prefix: openai.Prefix, Write: openai.WriteError},
			{Prefix: anthropic.Prefix, Write: anthropic.WriteError},
		}}

	// The audit log: every recorded call of every surface passes its middleware, after
	// authentication; its events are written off the request path.
	aopts := s.cfg.Audit
	aopts.Logger, aopts.Registerer = s.log, reg
	recorder := audit.NewRecorder(s.store, aopts)
	recorder.Start()
	s.mu.Lock()
	s.closers = append(s.closers, recorder.Close)
	s.mu.Unlock()
	auditor := audit.NewMiddleware(recorder, policy.Refuse)
	auditSvc := audit.NewService(s.store, s.core.PageTokens(), recorder).WithPrices(s.cfg.Core.Prices)

	// loops.v1 over Connect, gRPC and gRPC-Web, every handler behind the one error edge.
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(int(s.cfg.Limits.MaxBodyBytes)),
		// Small responses (an operation, a status) go uncompressed: gzip costs more CPU than
		// it saves bytes on them.
		connect.WithCompressMinBytes(compressMinBytes),
		withBoundedGzip(s.cfg.Limits.MaxBodyBytes, s.budget),
	}
	if ic := telemetry.ConnectInterceptor(); ic != nil { // an RPC span under the request's
		opts = append(opts, connect.WithInterceptors(ic))
	}
	opts = append(opts, connect.WithInterceptors(edge, audit.NoteInterceptor{}))
	mux.Handle(loopsv1connect.NewSessionServiceHandler(svc.Sessions, opts...))
	mux.Handle(loopsv1connect.NewTrainingServiceHandler(svc.Training, opts...))
	mux.Handle(loopsv1connect.NewOperationServiceHandler(svc.Operations, opts...))
	mux.Handle(loopsv1connect.NewCheckpointServiceHandler(svc.Checkpoints, opts...))
	mux.Handle(loopsv1connect.NewSamplingServiceHandler(svc.Sampling, opts...))
	mux.Handle(loopsv1connect.NewModelServiceHandler(svc.Models, opts...))
	mux.Handle(loopsv1connect.NewUsageServiceHandler(svc.Usage, opts...))
	mux.Handle(loopsv1connect.NewWorkspaceServiceHandler(svc.Workspace, opts...))
	mux.Handle(loopsv1connect.NewDeploymentServiceHandler(svc.Deployments, opts...))
	mux.Handle(loopsv1connect.NewProjectServiceHandler(svc.Projects, opts...))
	mux.Handle(loopsv1connect.NewWeightsAccessServiceHandler(svc.Weights, opts...))
	mux.Handle(loopsv1connect.NewSamplerClientServiceHandler(svc.Clients, opts...))
	mux.Handle(loopsv1connect.NewTraceServiceHandler(svc.Traces, opts...))
	mux.Handle(loopsv1connect.NewReceiptServiceHandler(svc.Receipts, opts...))
	mux.Handle(loopsv1connect.NewEvalServiceHandler(svc.Evals, opts...))
	js, err := s.newJobs(ctx)
	if err != nil {
		return nil, err
	}
	s.core.SetRewardRunner(jobRewards{jobs: js})
	mux.Handle(loopsv1connect.NewJobServiceHandler(js, opts...))
	mux.Handle(loopsv1connect.NewPoolServiceHandler(poolsvc.New(s.backend), opts...))
	aco := s.cfg.Access
	aco.Store, aco.Policy, aco.Models, aco.Logger = s.store, s.core.Policy(), s.core.ModelList, s.log
	accessSvc := access.New(aco)
	if err := accessSvc.Start(ctx); err != nil {
		return nil, fmt.Errorf("access grants: %w", err)
	}
	s.mu.Lock()
	s.closers = append(s.closers, accessSvc.Close)
	s.mu.Unlock()
	mux.Handle(loopsv1connect.NewAccessServiceHandler(accessSvc, opts...))
	keySvc := keysvc.New(s.cfg.Keys, s.cfg.Limits.MaxRequestsPerKey).WithSpend(s.core)
	mux.Handle(loopsv1connect.NewKeyServiceHandler(keySvc, opts...))
	mux.Handle(loopsv1connect.NewAuditServiceHandler(auditSvc, opts...))

	// loops.v1 as REST: grpc-gateway over a gRPC connection to this same listener.
	rest, err := s.restHandler(ctx, edge, auditor)
	if err != nil {
		return nil, err
	}
	mux.Handle("/v1/", limitBody(rest, s.cfg.Limits.MaxBodyBytes))
	transfers := s.cfg.Transfers
	transfers.DataDir = s.cfg.DataDir
	transfers.Logger = s.log
	ckhttp.New(s.core, transfers).Register(mux)
	registerTraceLinks(mux, s.core, s.log)

	// Tinker's routes.
	mux.Handle("/api/v1/", edge.countTinker(compat.NewHandler(compat.Services{
		Sessions:    svc.Sessions,
		Training:    svc.Training,
		Operations:  svc.Operations,
		Checkpoints: svc.Checkpoints,
		Sampling:    svc.Sampling,
		Models:      svc.Models,
		Usage:       svc.Usage,
		Audit:       auditSvc,
		Weights:     svc.Weights,
		Clients:     svc.Clients,
		Traces:      svc.Traces,
	}, compat.Options{
		MaxBodyBytes:         s.cfg.Limits.MaxBodyBytes,
		MaxDecompressedBytes: s.cfg.Limits.MaxDecompressedBytes,
		DecompressBudget:     s.budget,
		Logger:               s.log,
		Owner:                auth.Workspace,
		LongPoll:             s.cfg.Limits.LongPoll,
		Keys:                 keySvc,
		DisableJWTAuth:       s.cfg.APIKeys.DisableJWTAuth,
		ImageFetcher:         s.cfg.ImageFetcher,
	})))

	// OpenAI- and Anthropic-compatible inference, over one sampling engine.
	eng := inference.New(inference.Services{Sampling: svc.Sampling, Operations: svc.Operations, Models: svc.Models},
		inference.Options{MaxSamplers: s.cfg.Core.Limits.MaxSamplersInMemory, Workspace: auth.Workspace,
			AllowModality: func(ctx context.Context, modality, what string) error {
				return s.core.Policy().AllowModality(auth.Workspace(ctx), modality, what)
			}})
	s.mu.Lock()
	s.infer = eng
	s.mu.Unlock()
	mux.Handle(openai.Prefix, openai.NewHandler(openai.Services{
		Sampling:    svc.Sampling,
		Operations:  svc.Operations,
		Models:      svc.Models,
		Checkpoints: svc.Checkpoints,
		Deployments: svc.Deployments,
	}, openai.Options{
		MaxBodyBytes:         s.cfg.Limits.MaxBodyBytes,
		MaxSamplesPerRequest: s.cfg.Core.MaxSamplesPerRequest,
		Logger:               s.log,
		Engine:               eng,
	}))
	mux.Handle(anthropic.Prefix, anthropic.NewHandler(anthropic.Services{
		Sampling:   svc.Sampling,
		Operations: svc.Operations,
		Models:     svc.Models,
	}, anthropic.Options{
		MaxBodyBytes: s.cfg.Limits.MaxBodyBytes,
		Logger:       s.log,
		Engine:       eng,
	}))

	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPIDocument())
	})
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	opsvc.Register(mux, s.ops)

	// The web console at / (gateway/console): its session cookie becomes the API key
	// before the key middleware, so its pages go through the same auth as the API.
	cons := console.New(console.Services{
		Training:    svc.Training,
		Checkpoints: svc.Checkpoints,
		Sessions:    svc.Sessions,
		Sampling:    svc.Sampling,
		Usage:       svc.Usage,
		Workspace:   svc.Workspace,
		Deployments: svc.Deployments,
		Access:      accessSvc,
		Evals:       svc.Evals,
	}, console.Options{Authenticate: keys.Authenticate, Logger: s.log, Throttle: s.throttle, Proxies: s.cfg.TrustedProxies})
	pages := cons.Handler()
	mux.Handle("GET "+console.Root+"{$}", pages)
	mux.Handle(console.Prefix, pages)

	public := append(append([]string(nil), publicPaths...), console.PublicPaths...)
	policy.Public = public
	guarded := keys.Middleware(policy, auditor.Wrap(mux))
	return withBodyReadDeadline(s.cfg.Limits.BodyReadTimeout, recoverPanics(s.log, cons.Wrap(guarded))), nil
}

// restHandler builds the grpc-gateway mux. It dials this server's own listener over h2c, so
// REST requests pass through the same Connect handlers (and auth) as every other surface.
func (s *Server) restHandler(ctx context.Context, edge *edge, auditor *audit.Middleware) (http.Handler, error) {
	dial := []grpc.DialOption{}
	if telemetry.Enabled() { // the REST request's trace continues on its gRPC call
		dial = append(dial, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	}
	conn, err := grpc.NewClient(s.ln.Addr().String(), append(dial,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(restUserAgent),
		grpc.WithUnaryInterceptor(auditor.RelayInterceptor()),
		grpc.WithStreamInterceptor(auditor.RelayStreamInterceptor()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(s.cfg.Limits.MaxDecompressedBytes))),
	)...)
	if err != nil {
		return nil, fmt.Errorf("gateway: dialing own listener for REST: %w", err)
	}
	s.conn = conn
	gw := runtime.NewServeMux(
		runtime.WithErrorHandler(edge.restErrorHandler),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		runtime.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			switch k := strings.ToLower(key); k {
			case "x-api-key", "authorization", strings.ToLower(auth.NotOperatorHeader):
				return k, true
			}
			return runtime.DefaultHeaderMatcher(key)
		}),
	)
	for _, register := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		loopsv1.RegisterSessionServiceHandler,
		loopsv1.RegisterTrainingServiceHandler,
		loopsv1.RegisterOperationServiceHandler,
		loopsv1.RegisterCheckpointServiceHandler,
		loopsv1.RegisterSamplingServiceHandler,
		loopsv1.RegisterModelServiceHandler,
		loopsv1.RegisterUsageServiceHandler,
		loopsv1.RegisterWorkspaceServiceHandler,
		loopsv1.RegisterDeploymentServiceHandler,
		loopsv1.RegisterProjectServiceHandler,
		loopsv1.RegisterWeightsAccessServiceHandler,
		loopsv1.RegisterSamplerClientServiceHandler,
		loopsv1.RegisterTraceServiceHandler,
		loopsv1.RegisterReceiptServiceHandler,
		loopsv1.RegisterEvalServiceHandler,
		loopsv1.RegisterJobServiceHandler,
		loopsv1.RegisterPoolServiceHandler,
		loopsv1.RegisterKeyServiceHandler,
		loopsv1.RegisterAccessServiceHandler,
		loopsv1.RegisterAuditServiceHandler,
	} {
		if err := register(ctx, gw, conn); err != nil {
			return nil, fmt.Errorf("gateway: registering REST routes: %w", err)
		}
	}
	return gw, nil
}

// limitBody answers 413 with a JSON body when a request body is over limit bytes, whether
// it says so in Content-Length or streams it chunked; grpc-gateway would report a cut-off
// body as a 400. REST bodies are JSON messages, so reading them ahead is cheap; the buffer
// is allocated once at the Content-Length. grpc-gateway decompresses nothing, so a REST body
// costs what it weighs.
func limitBody(next http.Handler, limit int64) http.Handler {
	tooLarge := func(w http.ResponseWriter) {
		body := fmt.Sprintf(`{"code":8,"message":"request body is over the %d-byte limit: send less per request"}`, limit)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, body)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			tooLarge(w)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			b, err := bounded.ReadAll(r.Body, r.ContentLength, limit)
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge(w)
				return
			}
			if err != nil {
				http.Error(w, `{"code":3,"message":"reading the request body failed"}`, http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		next.ServeHTTP(w, r)
	})
}

// recoverPanics turns a panic in a handler into a 500 in Tinker's error shape, logged with
// its stack under an error id, instead of a dropped connection (see httpedge.Recover).
// Handlers must not panic on bad input; this is the last line of defence.
func recoverPanics(log *slog.Logger, next http.Handler) http.Handler {
	return compat.ErrorSurface("gateway", log).Recover(next)
}
