package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/access"
	"github.com/loops-dev/loops/gateway/audit"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckhttp"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/internal/imagefetch"
	"github.com/loops-dev/loops/internal/replicaplan"
	"github.com/loops-dev/loops/internal/telemetry"
	"github.com/spf13/cobra"
)

type serveFlags struct {
	addr        string
	dataDir     string
	backend     string
	models      []string
	backendOpts []string
	apiKeys     []string
	apiKeyFile  string
	sessionTTL  time.Duration
	// accessWebhookURL and accessWebhookSecretFile are the operator's webhook for access
	// requests and decisions (gateway/access); accessSweep how often grants expire and
	// deliveries are sent.
	accessWebhookURL        string
	accessWebhookSecretFile string
	accessSweep             time.Duration
	// auditRetention and auditMaxPerWorkspace bound the audit log (gateway/audit).
	auditRetention       time.Duration
	auditMaxPerWorkspace int
	maxLoraRank          int
	logLevel             string
	logFormat            string

	bodyReadTimeout time.Duration
	// drainDelay is --drain-delay (gateway.Config.DrainDelay).
	drainDelay        time.Duration
	longPoll          time.Duration
	fairnessTarget    float64
	maxRequestsPerKey int
	workspacePolicy   string
	prices            string

	db    databaseFlags
	lease leaseFlags
	// checkpointStore is --checkpoint-store: "" for the local folder in the data dir.
	checkpointStore string
	// trainChunkTokens and trainConcurrency are --train-chunk-tokens and
	// --train-concurrency: the piece size of forward/backward work and the batches of one
	// base model that run at once (core.Options.ChunkTokens, LaneConcurrency).
	trainChunkTokens, trainConcurrency int
	// deviceMemoryGiB is --device-memory-gib: the memory of one device, for planning the
	// replicas (internal/replicaplan); 0: what the backend reports (a GPU worker its
	// device's), else the models are not planned.
	deviceMemoryGiB float64
	// maxReceiptSteps and maxRecordDataBytes bound each run's receipt and recorded batches
	// (docs/receipts.md).
	maxReceiptSteps    int
	maxRecordDataBytes int64
	// samplerSlots is --sampler-slots: sampling calls that run at once (0: the core's
	// default).
	samplerSlots int
	// stepRecovery is --step-recovery: keep every run recoverable step by step, not only
	// those on preemptible pools.
	stepRecovery bool
	// operatorKeys are --operator-key: the keys of the operator role (PoolService).
	operatorKeys []string
	// noJWTAuth, tokenLifetime, signingKeyRotation and keyCacheTTL configure stored API keys
	// and access tokens (gateway.APIKeysConfig).
	noJWTAuth          bool
	tokenLifetime      time.Duration
	signingKeyRotation time.Duration
	keyCacheTTL        time.Duration
	// trustedProxies are --trusted-proxy: the reverse proxies whose X-Forwarded-For and
	// X-Forwarded-Proto are believed.
	trustedProxies []string
	// imageFetchHosts are --image-fetch-hosts: the hosts image_asset_pointer chunks may
	// name (internal/imagefetch).
	imageFetchHosts []string
	// minTransferRate and transferRateWindow are --min-transfer-rate and
	// --transfer-rate-window (gateway/ckhttp).
	minTransferRate    int64
	transferRateWindow time.Duration
	// jobs are the --jobs-* flags (jobs.go).
	jobs jobsServeFlags
}

func serveCmd() *cobra.Command {
	f := serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the Loops server",
		Long: `Run the Loops server on one port: Tinker's HTTP API (point TINKER_BASE_URL at it),
loops.v1 over Connect, gRPC and REST, /openapi.json, /healthz and /metrics.

With no API keys configured the server accepts any tml-… key but listens on loopback
only, and answers only requests addressed to localhost, 127.0.0.1 or [::1] (403 for
another Host: a defence against DNS rebinding). Every flag can also be set by an environment variable: LOOPS_ADDR, LOOPS_DATA_DIR,
LOOPS_BACKEND, LOOPS_MODELS (comma-separated), LOOPS_API_KEYS (comma-separated KEY or
KEY=WORKSPACE), LOOPS_API_KEY_FILE, LOOPS_OPERATOR_KEYS (comma-separated),
LOOPS_WORKSPACE_POLICY, LOOPS_TRUSTED_PROXIES (comma-separated), LOOPS_DATABASE,
LOOPS_DB_MAX_CONNS, LOOPS_DB_CONNECT_TIMEOUT, LOOPS_DB_STATEMENT_TIMEOUT,
LOOPS_CHECKPOINT_STORE.

Records (sessions, runs, checkpoints, operations, usage) go to SQLite in --data-dir by
default; --database postgres://… keeps them in PostgreSQL instead (the schema is created
and upgraded at start-up). Checkpoint files go to the folder checkpoint-store in
--data-dir by default; --checkpoint-store s3://bucket/prefix keeps them in S3 or an
S3-compatible server instead (endpoint, region and credentials from AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the shared AWS credentials
file; see docs/checkpoint-store.md), so that gateways and workers on other hosts share them.

With --database postgres://…, gateways on the same database share a leader lease
(--leader-lease, --lease-ttl, --advertise-url; LOOPS_LEADER_LEASE, LOOPS_LEASE_TTL,
LOOPS_ADVERTISE_URL): one leads, a second loops serve is a standby that forwards to it and
takes over when it dies (docs/two-gateways.md).

--operator-key KEY (repeatable) configures an operator: a key that is no workspace's and
may call PoolService (loops pools, loops allocations: list, scale and delete worker pools,
see what each replica holds) and nothing else. With no API keys and no operator keys
configured, any key is an operator's from loopback (the only place open mode listens);
once operator keys are set, only they are (docs/pools.md).

--workspace-policy FILE gives workspaces limits (allowed base models, max sequence length,
max LoRA rank, runs at once, queued operations, sampling concurrency): see the
"Workspace policy" section of docs/semantics.md for the format. The file is reloaded when
it changes (a bad change is logged and the policy in force kept); a bad file at start
refuses to start.

--prices FILE is the price sheet (YAML or JSON): USD per million tokens by base model
(prefill, cached_prefill, sample, train), per GPU-hour of a dedicated replica, per GB-month
of checkpoint storage, and workspaces' own prices. Costs then show wherever usage does
(loops usage --cost, loops runs show, an operation's cost, Tinker's billing route,
loops_cost_usd_total on /metrics); with no sheet no costs are shown. The file is reloaded
when it changes (new work only; a bad change is logged and the sheet in force kept); a bad
file at start refuses to start. See "Prices" in docs/operations.md.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.db.applyEnv(cmd); err != nil {
				return err
			}
			return runServe(cmd.Context(), f)
		},
	}
	f.db.register(cmd)
	f.lease.register(cmd)
	f.jobs.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", env("LOOPS_ADDR", "127.0.0.1:8000"), "host:port to listen on (port 0 picks a free one)")
	fl.StringVar(&f.dataDir, "data-dir", env("LOOPS_DATA_DIR", defaultDataDir()), "folder for the database, checkpoints and built-in models")
	fl.StringVar(&f.backend, "backend", env("LOOPS_BACKEND", "reference"), "compute backend: "+strings.Join(backends.Names(), ", "))
	fl.StringSliceVar(&f.models, "model", envList("LOOPS_MODELS", []string{"loops/tiny"}), "base model to serve: loops/tiny, a Hugging Face folder, or a name in the local HF cache (repeatable)")
	fl.StringArrayVar(&f.backendOpts, "backend-opt", nil, "backend option KEY=VALUE (repeatable), e.g. threads=2 for reference, workers=host:port or device=cuda for torch")
	fl.StringSliceVar(&f.apiKeys, "api-key", envList("LOOPS_API_KEYS", nil), "accepted API key, KEY or KEY=WORKSPACE (repeatable; WORKSPACE is 1-64 letters, digits, '_' or '-', not starting with '-')")
	fl.StringSliceVar(&f.operatorKeys, "operator-key", envList("LOOPS_OPERATOR_KEYS", nil), "operator key, tml-… (repeatable): may call PoolService (loops pools, loops allocations) and nothing else; no workspace's key")
	fl.BoolVar(&f.noJWTAuth, "no-jwt-auth", os.Getenv("LOOPS_NO_JWT_AUTH") == "1", "tell tinker SDKs to send the API key on every request instead of exchanging it for short-lived tokens (JWTs); the SDK's whoami needs tokens (LOOPS_NO_JWT_AUTH=1)")
	fl.DurationVar(&f.tokenLifetime, "token-lifetime", auth.DefaultTokenLifetime, "how long an access token (JWT) a key is exchanged for lives (10m to 24h); the SDK renews it at about half its lifetime (before 0.38: 5 minutes before expiry)")
	fl.DurationVar(&f.signingKeyRotation, "signing-key-rotation", auth.DefaultSigningKeyRotation, "how long one token-signing key signs before the next replaces it (1h to 720h); old keys verify until their tokens expire")
	fl.DurationVar(&f.keyCacheTTL, "key-cache-ttl", auth.DefaultKeyCacheTTL, "how long a stored API key lookup is cached (1s to 5m): the most a revocation made on another gateway on the same database takes to reach this one")
	fl.StringVar(&f.apiKeyFile, "api-key-file", env("LOOPS_API_KEY_FILE", ""), "file of API keys, one KEY or KEY=WORKSPACE a line")
	fl.DurationVar(&f.sessionTTL, "session-ttl", 5*time.Minute, "how long a session lives without a heartbeat")
	fl.StringVar(&f.accessWebhookURL, "access-webhook-url", env("LOOPS_ACCESS_WEBHOOK_URL", ""), "http(s) URL that gets every access request and decision as a signed JSON POST, retried until it answers 2xx (docs/access.md); an operator setting, never a workspace's")
	fl.StringVar(&f.accessWebhookSecretFile, "access-webhook-secret-file", env("LOOPS_ACCESS_WEBHOOK_SECRET_FILE", ""), "file holding the secret that signs the webhook's bodies (HMAC-SHA256, X-Loops-Signature); required with --access-webhook-url")
	fl.DurationVar(&f.accessSweep, "access-sweep", access.DefaultSweepInterval, "how often expired access grants are recorded and webhook deliveries sent (1s to 1h); a grant stops applying at its expiry regardless")
	fl.DurationVar(&f.auditRetention, "audit-retention", audit.DefaultRetention, "how long audit events are kept (an hourly sweep removes older ones)")
	fl.IntVar(&f.auditMaxPerWorkspace, "audit-max-events", audit.DefaultMaxPerWorkspace, "the most audit events one workspace keeps (the sweep removes its oldest beyond it)")
	fl.BoolVar(&f.stepRecovery, "step-recovery", os.Getenv("LOOPS_STEP_RECOVERY") == "1", "keep every run recoverable step by step (a snapshot after each optim_step and a replay log), so a lost worker costs no step; on by itself for pools marked preemptible (LOOPS_STEP_RECOVERY=1)")
	fl.IntVar(&f.samplerSlots, "sampler-slots", 0, "sampling calls that run at once, decoded together by a batching backend (0: the default, 4); serving many concurrent inference requests wants about one per request in flight (bench/serving)")
	fl.IntVar(&f.maxReceiptSteps, "max-receipt-steps", 100000, "steps a run's receipt lists at most (forward_backward, optim_step, saves, loads); past it the receipt says truncated (docs/receipts.md)")
	fl.Int64Var(&f.maxRecordDataBytes, "max-record-data-bytes", 1<<30, "bytes of batches a run created with record_data keeps in the checkpoint store at most; past it recording stops and the receipt says why (docs/receipts.md)")
	fl.Float64Var(&f.deviceMemoryGiB, "device-memory-gib", 0, fmt.Sprintf("memory of one device (GiB) the models' replicas are planned for: loops models shows the devices a replica needs and the longest sequence a replica of --backend-opt gpus_per_replica devices (else 1) holds, and a model that cannot fit stops the server (0: the GPU worker's report, else no planning; at most %d)", maxDeviceMemoryGiB))
	fl.IntVar(&f.trainChunkTokens, "train-chunk-tokens", core.DefaultChunkTokens, fmt.Sprintf("forward/backward work runs in pieces of whole datums of at most this many tokens, scheduled fairly between workspaces piece by piece: bigger pieces cost less per token, smaller ones make another workspace wait less behind a big step (%d to %d; bench/fairness)", core.MinChunkTokens, core.MaxChunkTokens))
	fl.IntVar(&f.trainConcurrency, "train-concurrency", core.DefaultLaneConcurrency, fmt.Sprintf("forward/backward batches of one base model that run at once, at most one per workspace (1 to %d)", core.MaxLaneConcurrency))
	fl.IntVar(&f.maxLoraRank, "max-lora-rank", 64, "largest LoRA rank accepted")
	fl.StringVar(&f.logLevel, "log-level", env("LOOPS_LOG_LEVEL", "info"), "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", env("LOOPS_LOG_FORMAT", "text"), "text or json")
	fl.DurationVar(&f.longPoll, "long-poll", 25*time.Second, "how long Tinker's retrieve_future holds a pending operation before answering try_again with its queue state (at most 40s: the tinker SDK's read timeout is 45s)")
	fl.Float64Var(&f.fairnessTarget, "fairness-target", 0, "the p99 latency inflation (time from submission to end over the operation's own service time) a workspace may see; /metrics exports loops_fairness_slo_breached per workspace against it (0: no target)")
	fl.DurationVar(&f.bodyReadTimeout, "body-read-timeout", gateway.DefaultBodyReadTimeout, "how long a request body has to arrive once its headers have; a stalled body is cut off then (responses and long-polls are not limited)")
	fl.DurationVar(&f.drainDelay, "drain-delay", 0, fmt.Sprintf("on shutdown (SIGTERM), how long to keep serving once gRPC health and /readyz say NOT_SERVING, so that load balancers and Kubernetes stop sending first (at most %s, within the %s shutdown grace)", maxDrainDelay, shutdownGrace))
	fl.IntVar(&f.maxRequestsPerKey, "max-requests-per-key", auth.DefaultMaxRequestsPerKey, "requests one API key may have in flight at once (429 beyond); -1 for no cap")
	fl.StringVar(&f.checkpointStore, "checkpoint-store", env("LOOPS_CHECKPOINT_STORE", ""), "where checkpoint files go: s3://bucket/prefix (AWS_* environment variables) or a folder; default: checkpoint-store in --data-dir")
	fl.StringSliceVar(&f.imageFetchHosts, "image-fetch-hosts", envList("LOOPS_IMAGE_FETCH_HOSTS", nil), "host (name or name:port) whose https URLs Tinker image_asset_pointer chunks may name (repeatable): the gateway fetches those images (no redirects, 8 MiB each, 20 s a request); none: such chunks are refused and clients send the bytes")
	fl.StringSliceVar(&f.trustedProxies, "trusted-proxy", envList("LOOPS_TRUSTED_PROXIES", nil), "address or CIDR of a reverse proxy in front of the server (repeatable): only from these is X-Forwarded-For (the client address that wrong keys are throttled by) and X-Forwarded-Proto (https makes the console's cookie Secure) believed")
	fl.Int64Var(&f.minTransferRate, "min-transfer-rate", ckhttp.DefaultMinRate, "bytes a second a checkpoint download, export or import must keep up over --transfer-rate-window; a slower one is cut")
	fl.DurationVar(&f.transferRateWindow, "transfer-rate-window", ckhttp.DefaultRateWindow, "how long a checkpoint transfer may stay under --min-transfer-rate")
	fl.StringVar(&f.prices, "prices", env("LOOPS_PRICES", ""), "YAML or JSON price sheet: USD per million tokens by model, per GPU-hour, per GB-month, per workspace; reloaded when it changes (see docs/operations.md, Prices); none: no costs shown")
	fl.StringVar(&f.workspacePolicy, "workspace-policy", env("LOOPS_WORKSPACE_POLICY", ""), "YAML or JSON file of per-workspace limits: allowed models, max sequence length and LoRA rank, runs, queued operations, sampling concurrency, budgets (see docs/semantics.md); reloaded when it changes")
	return cmd
}

// shutdownGrace is how long a shutdown (SIGTERM, Ctrl-C) may take: the drain delay, then
// requests and backend calls in flight finishing.
const shutdownGrace = 20 * time.Second

// maxDrainDelay bounds --drain-delay, leaving most of the grace to the requests in flight.
const maxDrainDelay = 10 * time.Second

// accessWebhook checks the webhook flags and reads the secret.
func accessWebhook(f serveFlags) (access.WebhookOptions, error) {
	if f.accessWebhookURL == "" {
		if f.accessWebhookSecretFile != "" {
			return access.WebhookOptions{}, errors.New("--access-webhook-secret-file without --access-webhook-url: give the URL too, or leave both out")
		}
		return access.WebhookOptions{}, nil
	}
	u, err := url.Parse(f.accessWebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return access.WebhookOptions{}, fmt.Errorf("--access-webhook-url %q: use an http:// or https:// URL", f.accessWebhookURL)
	}
	if f.accessWebhookSecretFile == "" {
		return access.WebhookOptions{}, errors.New("--access-webhook-url needs --access-webhook-secret-file: the receiver checks each body's HMAC-SHA256 signature with that secret")
	}
	b, err := os.ReadFile(f.accessWebhookSecretFile)
	if err != nil {
		return access.WebhookOptions{}, fmt.Errorf("--access-webhook-secret-file: %w", err)
	}
	secret := bytes.TrimSpace(b)
	if len(secret) < 16 {
		return access.WebhookOptions{}, fmt.Errorf("--access-webhook-secret-file %s: the secret has %d bytes; use at least 16 (openssl rand -hex 32)", f.accessWebhookSecretFile, len(secret))
	}
	return access.WebhookOptions{URL: f.accessWebhookURL, Secret: secret}, nil
}

func runServe(ctx context.Context, f serveFlags) error {
	log, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	webhook, err := accessWebhook(f)
	if err != nil {
		return err
	}
	if f.accessSweep < time.Second || f.accessSweep > time.Hour {
		return fmt.Errorf("--access-sweep %s: use 1s to 1h (default %s)", f.accessSweep, access.DefaultSweepInterval)
	}
	// OpenTelemetry traces, when the OTEL_* variables ask for them (docs/operations.md);
	// the spans still buffered are flushed on the way out.
	shutdownTraces, err := telemetry.Setup(ctx, telemetry.DefaultServiceName)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTraces(sctx); err != nil {
			log.Warn("flushing the last spans failed", slog.Any("err", err))
		}
	}()
	if telemetry.Enabled() {
		log.Info("OpenTelemetry tracing is on (OTEL_* environment variables)")
	}
	if f.auditRetention < time.Hour {
		return fmt.Errorf("--audit-retention %s: keep audit events at least 1h (default %s)", f.auditRetention, audit.DefaultRetention)
	}
	if f.auditMaxPerWorkspace < 1000 {
		return fmt.Errorf("--audit-max-events %d: keep at least 1000 events per workspace (default %d)", f.auditMaxPerWorkspace, audit.DefaultMaxPerWorkspace)
	}
	if f.longPoll < 10*time.Millisecond || f.longPoll > 40*time.Second {
		return fmt.Errorf("--long-poll %v is out of range: use 10ms to 40s (the tinker SDK's read timeout is 45s)", f.longPoll)
	}
	if f.fairnessTarget != 0 && (f.fairnessTarget < 1 || math.IsNaN(f.fairnessTarget) || math.IsInf(f.fairnessTarget, 0)) {
		return fmt.Errorf("--fairness-target %v is not a latency inflation: use 0 (none) or a number of at least 1 (e.g. 3)", f.fairnessTarget)
	}
	if f.tokenLifetime < 10*time.Minute || f.tokenLifetime > 24*time.Hour {
		return fmt.Errorf("--token-lifetime %v is out of range: use 10m to 24h (tinker SDKs before 0.38 renew a token 5 minutes before it expires)", f.tokenLifetime)
	}
	if f.signingKeyRotation < time.Hour || f.signingKeyRotation > 720*time.Hour {
		return fmt.Errorf("--signing-key-rotation %v is out of range: use 1h to 720h", f.signingKeyRotation)
	}
	if f.keyCacheTTL < time.Second || f.keyCacheTTL > 5*time.Minute {
		return fmt.Errorf("--key-cache-ttl %v is out of range: use 1s to 5m", f.keyCacheTTL)
	}
	if f.maxReceiptSteps < 1 || f.maxReceiptSteps > 1<<30 || f.maxRecordDataBytes < 1 || f.maxRecordDataBytes > 1<<40 {
		return fmt.Errorf("--max-receipt-steps (%d) must be 1 to 2^30 and --max-record-data-bytes (%d) 1 to 2^40", f.maxReceiptSteps, f.maxRecordDataBytes)
	}
	if f.trainChunkTokens < core.MinChunkTokens || f.trainChunkTokens > core.MaxChunkTokens {
		return fmt.Errorf("--train-chunk-tokens %d is out of range: use %d to %d", f.trainChunkTokens, core.MinChunkTokens, core.MaxChunkTokens)
	}
	if !(f.deviceMemoryGiB >= 0 && f.deviceMemoryGiB <= maxDeviceMemoryGiB) {
		return fmt.Errorf("--device-memory-gib %g is out of range: use 0 (not set) to %d", f.deviceMemoryGiB, maxDeviceMemoryGiB)
	}
	if f.drainDelay < 0 || f.drainDelay > maxDrainDelay {
		return fmt.Errorf("--drain-delay %v is out of range: use 0 to %s (the shutdown grace is %s)", f.drainDelay, maxDrainDelay, shutdownGrace)
	}
	if f.trainConcurrency < 1 || f.trainConcurrency > core.MaxLaneConcurrency {
		return fmt.Errorf("--train-concurrency %d is out of range: use 1 to %d", f.trainConcurrency, core.MaxLaneConcurrency)
	}
	entries := f.apiKeys
	if f.apiKeyFile != "" {
		more, err := auth.LoadKeyFile(f.apiKeyFile)
		if err != nil {
			return err
		}
		entries = append(entries, more...)
	}
	keys, err := auth.ParseKeys(entries)
	if err != nil {
		return err
	}
	if err := keys.AddOperatorKeys(f.operatorKeys); err != nil {
		return fmt.Errorf("--operator-key: %w", err)
	}
	proxies, err := auth.ParseTrustedProxies(f.trustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxy: %w", err)
	}
	fetcher, err := imagefetch.New(imagefetch.Options{Hosts: f.imageFetchHosts})
	if err != nil {
		return fmt.Errorf("--image-fetch-hosts: %w", err)
	}
	var polFile *policy.Watcher
	if f.workspacePolicy != "" {
		if polFile, err = policy.Watch(f.workspacePolicy, log); err != nil {
			return err
		}
	}
	var sheet *prices.Watcher
	if f.prices != "" {
		if sheet, err = prices.Load(f.prices, log); err != nil {
			return err
		}
	}
	host, _, err := net.SplitHostPort(f.addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", f.addr, err)
	}
	if keys.Open() && !isLoopback(host) {
		return fmt.Errorf("no API keys are configured, so Loops only listens on loopback, not %q: listen on 127.0.0.1 or set --api-key / LOOPS_API_KEYS", f.addr)
	}
	backendOpts := map[string]string{}
	for _, kv := range f.backendOpts {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--backend-opt %q: use KEY=VALUE", kv)
		}
		backendOpts[k] = v
	}
	if err := os.MkdirAll(f.dataDir, 0o755); err != nil {
		return fmt.Errorf("creating --data-dir: %w", err)
	}
	st, storeDesc, err := f.db.open(ctx, f.dataDir)
	if err != nil {
		return err
	}
	log.Info("store opened", slog.String("store", storeDesc))
	var cks ckstore.Store
	if f.checkpointStore != "" {
		// LinkFiles: a folder store on the data dir's file system takes saves (staged in the
		// data dir, never modified afterwards) as hard links.
		if cks, err = ckstore.Open(ctx, f.checkpointStore, ckstore.Options{LinkFiles: true}); err != nil {
			_ = st.Close()
			return fmt.Errorf("--checkpoint-store: %w", err)
		}
		if f.backend == workerBackend { // its workers reach the store too
			if err := workerStoreOptions(ctx, cks, backendOpts); err != nil {
				_ = st.Close()
				return err
			}
		}
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		_ = st.Close()
		return err
	}
	leaseCfg, closeLease, err := f.lease.open(ctx, f.db.url, ln.Addr(), f.db.connectTimeout, log)
	if leaseCfg != nil && f.checkpointStore == "" {
		log.Warn("the leader lease is on but checkpoints go to this gateway's --data-dir: a standby that takes over will not have them; set --checkpoint-store to a bucket or a folder every gateway reaches")
	}
	if err != nil {
		_ = ln.Close()
		_ = st.Close()
		return err
	}
	defer closeLease()
	srv, err := gateway.New(ctx, ln, gateway.Config{
		DataDir: f.dataDir,
		Store:   st,
		Backend: f.backend,
		BackendConfig: backends.Config{
			Models:      f.models,
			MaxLoraRank: f.maxLoraRank,
			Options:     backendOpts,
		},
		Keys: keys,
		Core: core.Options{SessionTTL: f.sessionTTL, Policy: polFile.Current(), PolicyFile: polFile, Prices: sheet, CheckpointStore: cks, SamplingConcurrency: f.samplerSlots, RecoverSteps: f.stepRecovery,
			FairnessTarget: f.fairnessTarget, ChunkTokens: f.trainChunkTokens, LaneConcurrency: f.trainConcurrency,
			Replica: replicaConfig(f.deviceMemoryGiB, backendOpts),
			Limits:  core.Limits{MaxReceiptStepsPerRun: f.maxReceiptSteps, MaxRecordDataBytesPerRun: int(f.maxRecordDataBytes)}},
		Limits: gateway.Limits{
			BodyReadTimeout:   f.bodyReadTimeout,
			MaxRequestsPerKey: f.maxRequestsPerKey,
			LongPoll:          f.longPoll,
		},
		DrainDelay:     f.drainDelay,
		Logger:         log,
		Lease:          leaseCfg,
		Jobs:           f.jobs.config(),
		TrustedProxies: proxies,
		ImageFetcher:   fetcher,
		Transfers:      ckhttp.Options{MinRate: f.minTransferRate, RateWindow: f.transferRateWindow},
		APIKeys: gateway.APIKeysConfig{
			Cache:          auth.DirectoryOptions{TTL: f.keyCacheTTL},
			Tokens:         auth.TokenOptions{Lifetime: f.tokenLifetime, Rotation: f.signingKeyRotation},
			DisableJWTAuth: f.noJWTAuth,
		},
		Audit:  audit.Options{Retention: f.auditRetention, MaxPerWorkspace: f.auditMaxPerWorkspace},
		Access: access.Options{Webhook: webhook, SweepInterval: f.accessSweep},
	})
	if err != nil {
		_ = ln.Close()
		return err
	}
	url := "http://" + ln.Addr().String()
	keyHint := "tml-anything"
	if !keys.Open() {
		keyHint = "<one of your --api-key values>"
	}
	cksDesc := f.checkpointStore
	if c := srv.Core(); c != nil {
		cksDesc = c.CheckpointStore().String()
	}
	fmt.Fprintf(os.Stderr, "Loops listening on %s (backend %s, data in %s, store %s, checkpoint store %s)\n", url, f.backend, f.dataDir, storeDesc, cksDesc)
	if leaseCfg != nil {
		fmt.Fprintf(os.Stderr, "Leader lease on (TTL %s, advertised as %s): this gateway leads or stands by for the one that does; GET /healthz says which.\n", f.lease.ttl, leaseCfg.Address)
	}
	if keys.Open() {
		fmt.Fprintln(os.Stderr, "No API keys configured: accepting any tml-… key, loopback only.")
	} else {
		fmt.Fprintf(os.Stderr, "%d API key(s) configured.\n", keys.Len())
	}
	switch {
	case keys.Operators() > 0:
		fmt.Fprintf(os.Stderr, "%d operator key(s) configured (loops pools, loops allocations).\n", keys.Operators())
	case keys.Open():
		fmt.Fprintln(os.Stderr, "No operator keys configured: any key is an operator's from loopback (loops pools, loops allocations).")
	}
	fmt.Fprintf(os.Stderr, "To train with tinker:\n  export TINKER_BASE_URL=%s\n  export TINKER_API_KEY=%s\n", url, keyHint)
	fmt.Fprintf(os.Stderr, "Web console: %s/ (sign in with an API key)\n", url)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve() }()
	select {
	case err := <-errc:
		_ = srv.Close(context.Background())
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	return srv.Close(sctx)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	// A line logged under a request's context carries its trace_id and span_id.
	switch format {
	case "text":
		return slog.New(telemetry.LogHandler(slog.NewTextHandler(os.Stderr, opts))), nil
	case "json":
		return slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, opts))), nil
	}
	return nil, errors.New("--log-format must be text or json")
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envList(name string, def []string) []string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return strings.Split(v, ",")
	}
	return def
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "loops")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "loops")
	}
	return "loops-data"
}

// maxDeviceMemoryGiB bounds --device-memory-gib (a host's memory, for the CPU engine, fits).
const maxDeviceMemoryGiB = 1 << 16

// replicaConfig is the deployment the models are planned for: --device-memory-gib per
// device and the pool's gpus_per_replica devices (1 when unset or 0: a CPU replica is one
// device, its host's memory; the backend checks the option's value itself).
func replicaConfig(memGiB float64, backendOpts map[string]string) replicaplan.Config {
	devices := int64(1)
	if n, err := strconv.ParseInt(backendOpts["gpus_per_replica"], 10, 32); err == nil && n > 0 {
		devices = n
	}
	return replicaplan.Config{DeviceMemory: int64(memGiB * (1 << 30)), Devices: devices}
}
