package ckhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
)

// Paths of the handlers. The core issues the URLs of downloads and exports, so their
// paths are its.
const (
	// ArchivePrefix serves download links: ArchivePrefix + token + ".tar" is a tar of the
	// checkpoint, ArchivePrefix + token + "/" + file one of its files. No API key: the token
	// is the credential (list the prefix among the public paths).
	ArchivePrefix = core.ArchivePathPrefix
	// ExportPath serves exports: GET ExportPath?path=<tinker path>&format=peft|merged, with
	// the API key, answers a tar of the exported folder.
	ExportPath = core.ExportPath
	// ImportPath takes imports: POST ImportPath?base_model=<model>[&name=<name>], with the
	// API key and a tar of a PEFT adapter folder (adapter_config.json,
	// adapter_model.safetensors) as the body, answers the new checkpoint (loops.v1
	// Checkpoint as JSON): tinker://<run>/weights/<name> of a run made for it, which
	// samplers, deployments and new training runs (from_checkpoint, load_state) take like
	// any other.
	ImportPath = "/v1/checkpoint_imports"
)

// Fixed bounds of a transfer.
const (
	// MaxExportBytes caps a merged model folder (its float32 weights).
	MaxExportBytes = 32 << 30
	// ExportTimeout bounds a merged export from its start to the end of its stream.
	ExportTimeout = 30 * time.Minute
	// MaxImportBytes caps an import's body (the tar).
	MaxImportBytes = 4 << 30
	// ImportTimeout bounds an import from its start to its answer: its body is not bound
	// by the server's body read timeout, only by this and the minimum rate.
	ImportTimeout = 30 * time.Minute
	// exportFolder holds merged exports while they stream, under Options.DataDir.
	exportFolder = "exports"
)

// Defaults of Options.
const (
	// DefaultMaxExports is how many merged exports run at once on the server.
	DefaultMaxExports = 2
	// DefaultMaxImports is how many imports run at once on the server.
	DefaultMaxImports = 2
	// DefaultMinRate is the slowest a transfer may move, in bytes a second over
	// DefaultRateWindow: 64 KiB/s, under which a 4 GiB import would need over 18 hours.
	DefaultMinRate = 64 << 10
	// DefaultRateWindow is how long a transfer may stay under the minimum rate.
	DefaultRateWindow = 30 * time.Second
)

// Checkpoints is what the handlers need of the core; *core.Core implements it. Errors are
// connect errors with the codes of the one error table (internal/errs): NotFound for what
// the caller may not see, InvalidArgument for a bad import, Internal for the server's own
// failures (masked at the edge).
type Checkpoints interface {
	// OpenArchiveLink returns what a download link's token grants now (NotFound when it
	// grants nothing any more, saying why).
	OpenArchiveLink(ctx context.Context, token string) (core.ArchiveLink, error)
	// OpenArchiveFile opens one file of a link's manifest, as served (in Tinker's layout),
	// with the size it yields.
	OpenArchiveFile(ctx context.Context, link core.ArchiveLink, name string) (io.ReadCloser, int64, error)
	// OpenCheckpointFolder opens a local folder with the files of the checkpoint at path
	// that workspace ws may read.
	OpenCheckpointFolder(ctx context.Context, ws, path string) (core.CheckpointFolder, error)
	// MergeAdapter writes ck's base model with the adapter in adapterDir merged in into
	// outDir, at most maxBytes of weights, and returns the bytes written.
	MergeAdapter(ctx context.Context, ck *loopsv1.Checkpoint, adapterDir, outDir string, maxBytes int64) (int64, error)
	// ImportAdapter checks req, has fill write the adapter folder into an empty folder,
	// checks it and stores it as a checkpoint of req.Workspace; fill's error is returned
	// as it is.
	ImportAdapter(ctx context.Context, req core.ImportRequest, fill func(dir string) error) (*loopsv1.Checkpoint, error)
}

var _ Checkpoints = (*core.Core)(nil)

// Options configure the handlers. Zero values take the defaults.
type Options struct {
	// DataDir is the server's data dir: merged exports are written under DataDir/exports
	// while they stream. Required for merged exports.
	DataDir string
	// MaxExports is how many merged exports run at once on the server (default
	// DefaultMaxExports); MaxExportsPerWorkspace how many of them one workspace may run
	// (default half of MaxExports, at least 1).
	MaxExports             int
	MaxExportsPerWorkspace int
	// MaxImports is how many imports run at once on the server (default
	// DefaultMaxImports); MaxImportsPerWorkspace how many of them one workspace may run
	// (default half of MaxImports, at least 1).
	MaxImports             int
	MaxImportsPerWorkspace int
	// MinRate is the slowest a transfer (download, export or import) may move, in bytes a
	// second (default DefaultMinRate): one that moves fewer than MinRate × RateWindow bytes
	// in RateWindow (default DefaultRateWindow) is cut.
	MinRate    int64
	RateWindow time.Duration
	// RetryAfter is the retry hint of a refused transfer (default errs.DefaultRetryAfter).
	RetryAfter time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// withDefaults fills in the documented defaults.
func (o Options) withDefaults() Options {
	share := func(n int) int { return max(1, n/2) }
	if o.MaxExports <= 0 {
		o.MaxExports = DefaultMaxExports
	}
	if o.MaxExportsPerWorkspace <= 0 {
		o.MaxExportsPerWorkspace = share(o.MaxExports)
	}
	if o.MaxImports <= 0 {
		o.MaxImports = DefaultMaxImports
	}
	if o.MaxImportsPerWorkspace <= 0 {
		o.MaxImportsPerWorkspace = share(o.MaxImports)
	}
	o.MaxExportsPerWorkspace = min(o.MaxExportsPerWorkspace, o.MaxExports)
	o.MaxImportsPerWorkspace = min(o.MaxImportsPerWorkspace, o.MaxImports)
	if o.MinRate <= 0 {
		o.MinRate = DefaultMinRate
	}
	if o.RateWindow <= 0 {
		o.RateWindow = DefaultRateWindow
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = errs.DefaultRetryAfter
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Handlers serve the checkpoint transfers of one core.
type Handlers struct {
	c       Checkpoints
	opts    Options
	log     *slog.Logger
	edge    *httpedge.Surface
	exports *slots
	imports *slots
}

// New returns the handlers over c.
func New(c Checkpoints, opts Options) *Handlers {
	opts = opts.withDefaults()
	return &Handlers{c: c, opts: opts, log: opts.Logger, edge: errorSurface(opts.Logger),
		exports: newSlots("merged exports", "max_concurrent_exports", "max_exports_per_workspace", opts.MaxExports, opts.MaxExportsPerWorkspace, opts.RetryAfter),
		imports: newSlots("imports", "max_concurrent_imports", "max_imports_per_workspace", opts.MaxImports, opts.MaxImportsPerWorkspace, opts.RetryAfter),
	}
}

// Register mounts the three handlers on mux: ArchivePrefix (any method; GET and HEAD
// answer), GET ExportPath and POST ImportPath.
func (h *Handlers) Register(mux *http.ServeMux) {
	mux.Handle(ArchivePrefix, h.Archives())
	mux.Handle("GET "+ExportPath, h.Export())
	mux.Handle("POST "+ImportPath, h.Import())
}

// errNoDataDir is a merged export on handlers configured without a data dir.
var errNoDataDir = errors.New("ckhttp.Options.DataDir is not set")

// invalidArgument is a client's mistake: a 400 with the message.
func invalidArgument(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// internalErr wraps an unexpected failure: Internal, masked at the edge and logged.
func internalErr(what string, err error) error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s: %w", what, err))
}

// detailError is an answer the handlers give themselves: status with {"detail": msg}.
type detailError struct {
	status int
	msg    string
}

func (e *detailError) Error() string { return e.msg }

// detailBody is the JSON body of every error answer.
type detailBody struct {
	Detail string `json:"detail"`
}

// errorSurface answers the handlers' errors (internal/httpedge) as {"detail": msg} with the
// HTTP status of the error table (loops.v1's, as the REST surface answers) and, for a 429,
// Retry-After; a masked error is logged under an id and its message replaced; a client that
// went away gets nothing.
func errorSurface(log *slog.Logger) *httpedge.Surface {
	return &httpedge.Surface{Name: "ckhttp", Logger: log, Classify: answerOf,
		EncodeFailure: []byte(`{"detail":"internal error: cannot encode the response"}`)}
}

func answerOf(err error) httpedge.Answer {
	var de *detailError
	if errors.As(err, &de) {
		return httpedge.Answer{Status: de.status, Body: detailBody{de.msg}, Message: de.msg}
	}
	out, msg := httpedge.Public(err)
	return httpedge.Answer{Status: out.Entry.HTTPStatus, Body: detailBody{msg}, ID: out.ID, Reason: errs.Reason(out.Err), Message: msg}
}
