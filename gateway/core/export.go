package core

import (
	"archive/tar"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// ExportPath is where checkpoint exports are served: GET ExportPath?path=<tinker
// path>&format=peft|merged, with the API key, answers a tar stream of the exported folder.
const ExportPath = "/v1/checkpoint_exports"

// Export bounds. A merged export holds the merged weights in memory and on disk while it
// streams, so few run at once; past MaxConcurrentExports another is refused (429).
const (
	// MaxConcurrentExports is how many merged exports run at once on this server.
	MaxConcurrentExports = 2
	// MaxExportBytes caps a merged model folder (its float32 weights).
	MaxExportBytes = 32 << 30
	// ExportTimeout bounds a merged export from its start to the end of its stream.
	ExportTimeout = 30 * time.Minute
	// exportFolder holds merged exports while they stream, under the data dir.
	exportFolder = "exports"
)

// exportSlots are the merged exports running now.
var exportSlots = make(chan struct{}, MaxConcurrentExports)

// exportFormats are the formats' names in ExportPath's query.
var exportFormats = map[loopsv1.ExportFormat]string{
	loopsv1.ExportFormat_EXPORT_FORMAT_PEFT:   "peft",
	loopsv1.ExportFormat_EXPORT_FORMAT_MERGED: "merged",
}

// GetCheckpointExportURL checks that the caller may read the checkpoint and returns the
// URL of its export (on this server, to be fetched with the API key).
func (s CheckpointService) GetCheckpointExportURL(ctx context.Context, req *loopsv1.GetCheckpointExportURLRequest) (*loopsv1.GetCheckpointExportURLResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	name, ok := exportFormats[req.GetFormat()]
	if !ok {
		return nil, invalidArgument("format must be EXPORT_FORMAT_PEFT or EXPORT_FORMAT_MERGED, got %v", req.GetFormat())
	}
	if _, _, err := s.c.resolveOwned(ctx, ws, req.GetPath()); err != nil {
		return nil, err
	}
	q := url.Values{"path": {req.GetPath()}, "format": {name}}
	return &loopsv1.GetCheckpointExportURLResponse{Url: ExportPath + "?" + q.Encode()}, nil
}

// ExportHandler serves ExportPath: the checkpoint's adapter folder (peft) or its base model
// with the adapter merged in (merged), as a tar stream. The caller's workspace must own the
// checkpoint or the checkpoint be public.
func (c *Core) ExportHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := auth.RequireWorkspace(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		q := r.URL.Query()
		format := q.Get("format")
		if format != "peft" && format != "merged" {
			writeDetail(w, http.StatusBadRequest, "format must be peft or merged")
			return
		}
		ck, ref, err := c.resolveCheckpoint(r.Context(), ws, q.Get("path"))
		if err != nil {
			writeErr(w, err)
			return
		}
		defer ref.release()
		name := strings.ReplaceAll(ck.GetTrainingRunId()+"-"+ck.GetId(), "/", "-") + "-" + format
		if format == "peft" {
			c.streamFolder(r.Context(), w, ref.dir, name, []string{peft.AdapterConfigFile, peft.AdapterWeightsFile})
			return
		}
		select {
		case exportSlots <- struct{}{}:
			defer func() { <-exportSlots }()
		default:
			writeErr(w, c.limitReached("LIMIT_REACHED", "max_concurrent_exports", "%d merged exports are running, the most this server runs at once: retry later", MaxConcurrentExports))
			return
		}
		merger, ok := c.backend.Sampler().(backends.Merger)
		if !ok {
			writeErr(w, failedPrecondition("this server's backend cannot merge adapters: export with --format peft"))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), ExportTimeout)
		defer cancel()
		root := filepath.Join(c.opts.DataDir, exportFolder)
		if err := os.MkdirAll(root, 0o755); err != nil {
			writeErr(w, internal("creating the export folder", err))
			return
		}
		out, err := os.MkdirTemp(root, "merge-")
		if err != nil {
			writeErr(w, internal("creating the export folder", err))
			return
		}
		defer os.RemoveAll(out)
		start := c.now()
		n, err := merger.MergeAdapter(ctx, backends.MergeRequest{BaseModel: ck.GetBaseModel(), AdapterDir: ref.dir, OutDir: out, MaxBytes: MaxExportBytes})
		if err != nil {
			if connect.CodeOf(err) == connect.CodeUnknown {
				err = internal("merging the adapter", err)
			}
			writeErr(w, err)
			return
		}
		c.log.Info("merged export", slog.String("workspace", ws), slog.String("path", ck.GetTinkerPath()),
			slog.Int64("bytes", n), slog.Duration("merge", c.now().Sub(start)))
		c.streamFolder(ctx, w, out, name, nil)
	})
}

// writeErr answers err as writeDetail does, with the HTTP status of the error table; a
// masked error is logged under an id and its message replaced.
func writeErr(w http.ResponseWriter, err error) {
	out := errs.Edge(err)
	if out.ID != "" {
		slog.Error("export failed", slog.String("error_id", out.ID), slog.Any("err", err))
	}
	writeDetail(w, out.Entry.HTTPStatus, out.Err.Message())
}

// streamFolder writes the regular files of dir (those named, or all of them, sorted) as a
// tar stream. A failure midway cuts the response short: the client sees a broken download.
func (c *Core) streamFolder(ctx context.Context, w http.ResponseWriter, dir, name string, only []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		writeErr(w, internal("reading the export folder", err))
		return
	}
	var files []os.FileInfo
	for _, e := range entries {
		if only != nil && !slices.Contains(only, e.Name()) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			files = append(files, fi)
		}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", "attachment; filename=\""+name+".tar\"")
	tw := tar.NewWriter(w)
	for _, fi := range files {
		if err := ctx.Err(); err != nil {
			panic(http.ErrAbortHandler)
		}
		if err := tw.WriteHeader(&tar.Header{Name: fi.Name(), Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime(), Typeflag: tar.TypeReg}); err != nil {
			panic(http.ErrAbortHandler)
		}
		f, err := os.Open(filepath.Join(dir, fi.Name()))
		if err != nil {
			c.log.Error("opening an export file", slog.String("file", fi.Name()), slog.Any("err", err))
			panic(http.ErrAbortHandler)
		}
		_, err = io.CopyN(tw, f, fi.Size())
		f.Close()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
	if err := tw.Close(); err != nil {
		panic(http.ErrAbortHandler)
	}
}
