package serve

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/internal/telemetry"
)

// Exit codes of Main.
const (
	ExitOK      = 0 // stopped cleanly (signal, drain, parent gone), or --help
	ExitFailure = 1 // the engine did not start, the listener failed, the gateway refused
	ExitUsage   = 2 // bad flags
)

// ExitOnStdinEOFEnv, set to 1, makes ParseArgs set Options.ExitOnStdinEOF (the gateway
// sets it on the workers it starts).
const ExitOnStdinEOFEnv = "LOOPS_WORKER_EXIT_ON_STDIN_EOF"

// LogLevelEnv sets Main's log level (DEBUG, INFO, WARN, ERROR; default INFO).
const LogLevelEnv = "LOOPS_WORKER_LOG"

// pythonOnly are flags of the Python worker that the Go worker has no use for.
var pythonOnly = map[string]bool{"dtype": true, "sampler": true, "attn-implementation": true, "grad-checkpointing": true,
	"no-grad-checkpointing": true, "vllm-gpu-memory-utilization": true, "vllm-max-loras": true,
	"vllm-max-model-len": true, "vllm-enforce-eager": true, "grpc-threads": true,
	"checkpoint-tokens": true, "logits-budget": true, "full-finetune-runs": true}

// multiGPU are the flags that spread a replica over several GPUs (the pool provider passes
// them for gpus_per_replica ≥ 2); the Go worker is one process on the CPU.
var multiGPU = map[string]bool{"world-size": true, "vllm-tensor-parallel-size": true}

var poolIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// flags are the command-line settings before they are checked.
type flags struct {
	listen, device, dataDir                  string
	register, pool, joinTokenFile, advertise string
	tls                                      mtls.Files
	models, allowDirs, origins               listFlag
	maxLoraRank, maxAdapters, threads        int
	replica                                  int
	prefixCacheBytes                         string
}

type listFlag []string

func (m *listFlag) String() string     { return strings.Join(*m, ",") }
func (m *listFlag) Set(v string) error { *m = append(*m, v); return nil }

// define declares the flags on fs: the Python worker's names and defaults, where the Go
// worker has the setting.
func define(fs *flag.FlagSet, f *flags) {
	fs.StringVar(&f.listen, "listen", "127.0.0.1:0", "host:port to listen on (port 0 picks a free port)")
	fs.Var(&f.models, "model", "base model to serve, repeatable (default "+tiny.Name+"): "+tiny.Name+", the built-in model\n"+
		"(written under --data-dir; "+tiny.Name+"=PATH means the same), a local Hugging Face folder, or an id\n"+
		"in the local Hugging Face cache; NAME=PATH only where PATH is NAME's own folder")
	fs.StringVar(&f.device, "device", "auto", "auto or cpu (the Go worker runs on the CPU)")
	fs.IntVar(&f.maxLoraRank, "max-lora-rank", 64, "largest LoRA rank an adapter may have")
	fs.IntVar(&f.maxAdapters, "max-adapters", 256, "adapters held at once (the trainer's slots)")
	fs.IntVar(&f.threads, "threads", 0, "goroutines for the matrix kernels (0 = every CPU)")
	fs.StringVar(&f.prefixCacheBytes, "prefix-cache-bytes", "", "the sampler's prefix cache budget in bytes (empty: 256 MiB; 0: off)")
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "folder for the built-in model (DATA_DIR/models/loops-tiny)")
	fs.StringVar(&f.tls.Cert, "tls-cert", "", "the worker's certificate, issued by the gateway (required: the worker serves over\n"+
		"mutual TLS only; the gateway writes it for the workers it starts, loops pools credentials\n"+
		"issues it for one started by hand)")
	fs.StringVar(&f.tls.Key, "tls-key", "", "the worker's private key (a file of mode 0600)")
	fs.StringVar(&f.tls.CA, "tls-ca", "", "the gateway CA's certificate: the only clients the worker answers, and the registry it trusts")
	fs.Var(&f.allowDirs, "allow-dir", "folder that requests may name to save adapters into or load and sample them from,\n"+
		"repeatable (the gateway's data dir, when the worker shares its file system); none: no folder")
	fs.Var(&f.origins, "checkpoint-origin", "scheme://host[:port] of the checkpoint store that checkpoint URLs may name, repeatable;\n"+
		"none: no URL")
	fs.StringVar(&f.register, "register", "", "gateway registry URL (https://host:port): register and heartbeat there")
	fs.StringVar(&f.pool, "pool", "", "with --register: the pool this worker is a replica of")
	fs.IntVar(&f.replica, "replica", 0, "with --register: the replica index in the pool")
	fs.StringVar(&f.joinTokenFile, "join-token-file", "", "with --register: file holding the gateway's join token")
	fs.StringVar(&f.advertise, "advertise", "", "with --register: host the gateway dials (default: the --listen host, or this\n"+
		"host's address when listening on all interfaces)")
}

// defaultDataDir is the reference engine's default: loops under the user cache folder.
func defaultDataDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "loops")
}

// Usage writes the command's synopsis and its flags to w.
func Usage(w io.Writer) {
	fs := flag.NewFlagSet("loops worker", flag.ContinueOnError)
	define(fs, &flags{})
	fs.SetOutput(w)
	_, _ = fmt.Fprint(w, `Usage: loops worker [flags]

Serve the pure-Go CPU engine (the reference backend) as a Loops worker: the
loops.backend.v1 TrainerService and SamplerService over gRPC/Connect on HTTP/2 with mutual
TLS: it answers only the gateway that issued its credentials. It prints
"`+strings.TrimSpace(ReadyPrefix)+` host:port" on stdout once it serves; with --register it
registers with the gateway's worker registry and heartbeats until it is told to drain.
The gateway starts it as a pool's worker with the torch backend's worker_command option
(e.g. worker_command="loops worker"); see docs/scale-out.md.

Flags:
`)
	fs.PrintDefaults()
	_, _ = fmt.Fprintf(w, `
Environment: %s=1 stops the worker when its stdin closes (the parent has gone);
%s sets the log level (DEBUG, INFO, WARN, ERROR).
Exit status: %d stopped cleanly, %d failed, %d bad flags.
`, ExitOnStdinEOFEnv, LogLevelEnv, ExitOK, ExitFailure, ExitUsage)
}

// ParseArgs reads the worker's flags (the Python worker's names; see Usage) into Options
// for Run. --help gives flag.ErrHelp; an unknown flag, a stray argument or a bad value
// gives an error that says what to pass instead. It also reads ExitOnStdinEOFEnv. It
// prints nothing.
func ParseArgs(args []string) (Options, error) {
	var f flags
	fs := flag.NewFlagSet("loops worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs, &f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Options{}, err
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: "); ok {
			name = strings.TrimLeft(name, "-")
			if multiGPU[name] {
				return Options{}, fmt.Errorf("--%s spreads a replica over several GPUs, which only the Python worker does; the Go worker is one process on the CPU: give its pool gpus_per_replica 0 or 1, or use the torch worker (no worker_command)", name)
			}
			if pythonOnly[name] {
				return Options{}, fmt.Errorf("--%s is a flag of the Python worker (python -m loops_worker); the Go worker computes in float32 on the CPU and does not take it", name)
			}
			return Options{}, fmt.Errorf("unknown flag --%s (see loops worker --help)", name)
		}
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected argument %q: every setting is a flag (see loops worker --help)", fs.Arg(0))
	}
	o := Options{Listen: f.listen, Register: f.register, Pool: f.pool, Replica: f.replica, JoinTokenFile: f.joinTokenFile,
		Advertise: f.advertise, ExitOnStdinEOF: os.Getenv(ExitOnStdinEOFEnv) == "1", AllowDirs: f.allowDirs, CheckpointOrigins: f.origins}
	o.Engine = reference.Options{DataDir: f.dataDir, MaxLoraRank: f.maxLoraRank, MaxAdapters: f.maxAdapters, Threads: f.threads}
	if f.prefixCacheBytes != "" {
		n, err := reference.ParsePrefixCacheBytes(f.prefixCacheBytes)
		if err != nil {
			return Options{}, fmt.Errorf("--prefix-cache-bytes: %w", err)
		}
		o.Engine.PrefixCacheBytes = n
	}
	if _, port, err := net.SplitHostPort(f.listen); err != nil {
		return Options{}, fmt.Errorf("--listen %q is not host:port (e.g. 127.0.0.1:0 or 0.0.0.0:7460)", f.listen)
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || strconv.FormatUint(n, 10) != port {
		return Options{}, fmt.Errorf("--listen %q: the port must be a number from 0 to 65535", f.listen)
	}
	switch f.device {
	case "auto", "cpu":
	default:
		return Options{}, fmt.Errorf("--device %q: the Go worker runs on the CPU (pass auto or cpu; for a GPU run python -m loops_worker)", f.device)
	}
	switch {
	case f.maxLoraRank < 1:
		return Options{}, fmt.Errorf("--max-lora-rank must be at least 1, got %d", f.maxLoraRank)
	case f.maxAdapters < 1:
		return Options{}, fmt.Errorf("--max-adapters must be at least 1, got %d", f.maxAdapters)
	case f.threads < 0:
		return Options{}, fmt.Errorf("--threads must be 0 (every CPU) or more, got %d", f.threads)
	case f.replica < 0 || f.replica >= pools.MaxReplicas:
		return Options{}, fmt.Errorf("--replica must be between 0 and %d, got %d", pools.MaxReplicas-1, f.replica)
	case f.dataDir == "":
		return Options{}, errors.New("--data-dir must not be empty")
	}
	if f.register != "" {
		u, err := url.Parse(f.register)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return Options{}, fmt.Errorf("--register %q is not a registry URL such as https://127.0.0.1:7450 (the registry serves TLS only)", f.register)
		}
		if f.pool == "" || f.joinTokenFile == "" {
			return Options{}, errors.New("--register needs --pool and --join-token-file")
		}
		if !poolIDRE.MatchString(f.pool) {
			return Options{}, fmt.Errorf("--pool %q must be 1-128 characters of A-Z a-z 0-9 . _ -", f.pool)
		}
	}
	for _, spec := range f.models {
		name, err := modelName(spec)
		if err != nil {
			return Options{}, err
		}
		o.Engine.Models = append(o.Engine.Models, name)
	}
	if _, err := newConfinement(f.allowDirs, f.origins); err != nil {
		return Options{}, err
	}
	if f.tls == (mtls.Files{}) {
		return Options{}, errors.New("--tls-cert, --tls-key and --tls-ca are required: the worker serves over mutual TLS only, with the credentials the gateway issues (loops pools credentials issues them for a worker started by hand)")
	}
	creds, err := mtls.Load(f.tls)
	if err != nil {
		return Options{}, err
	}
	o.Credentials = creds
	return o, nil
}

// modelName is the reference engine's name for a --model value: NAME, or NAME=PATH where
// the engine serves PATH under NAME (the built-in model, or PATH is NAME's own folder).
func modelName(spec string) (string, error) {
	name, path, hasPath := strings.Cut(spec, "=")
	switch {
	case name == "":
		return "", fmt.Errorf("--model %q: the model name is empty (pass NAME or NAME=PATH)", spec)
	case name == tiny.Name:
		return name, nil // built-in: written under --data-dir, whatever PATH holds
	case !hasPath:
		return name, nil // the engine resolves it when it starts, and says so if it cannot
	case path == "":
		return "", fmt.Errorf("--model %q: the path after = is empty", spec)
	case filepath.Clean(name) == filepath.Clean(path):
		return name, nil
	}
	if dir, _, err := reference.ResolveModelDir(name); err == nil && sameDir(dir, path) {
		return name, nil
	}
	return "", fmt.Errorf("--model %s: the Go worker names a local model by its folder, so it cannot serve %s as %q; pass --model %s (or --model NAME for a Hugging Face id in the local cache)", spec, path, name, path)
}

// sameDir reports whether a and b are the same folder.
func sameDir(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// ServiceName is the worker's OpenTelemetry service.name unless OTEL_SERVICE_NAME says
// otherwise.
const ServiceName = "loops-worker"

// Main runs the worker with command-line args (without the program name) until SIGTERM or
// SIGINT, logging to stderr, and returns its exit status: ExitOK, ExitFailure or
// ExitUsage. --help prints Usage on stdout.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := ParseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		Usage(stdout)
		return ExitOK
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "loops worker: %v\n", err)
		return ExitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv(LogLevelEnv))); err != nil {
		level = slog.LevelInfo
	}
	log := slog.New(telemetry.LogHandler(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))).With(slog.String("component", "worker"))
	slog.SetDefault(log) // the engine logs through the default logger
	o.Logger, o.Stdout = log, stdout
	// Traces, when the OTEL_* variables ask for them: the gateway's calls carry their
	// traceparent, so the worker's spans are children of the operation's.
	shutdown, err := telemetry.Setup(ctx, ServiceName)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "loops worker: %v\n", err)
		return ExitUsage
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
	if err := Run(ctx, o); err != nil {
		_, _ = fmt.Fprintf(stderr, "loops worker: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}
