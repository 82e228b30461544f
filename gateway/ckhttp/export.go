package ckhttp

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/auth"
)

// Export serves ExportPath: the checkpoint's adapter folder (format=peft) or its base
// model with the adapter merged in (format=merged), as a tar stream. The caller's
// workspace must own the checkpoint or the checkpoint be public. A merged export takes one
// of the export slots while it merges and streams (429 past the server's or the
// workspace's share), and its folder under the data dir is removed when it ends.
func (h *Handlers) Export() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ws, err := auth.RequireWorkspace(r.Context())
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		q := r.URL.Query()
		format := q.Get("format")
		if format != "peft" && format != "merged" {
			h.edge.WriteError(w, r, &detailError{http.StatusBadRequest, "format must be peft or merged"})
			return
		}
		folder, err := h.c.OpenCheckpointFolder(r.Context(), ws, q.Get("path"))
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		defer folder.Release()
		ck := folder.Checkpoint
		name := strings.ReplaceAll(ck.GetTrainingRunId()+"-"+ck.GetId(), "/", "-") + "-" + format
		if format == "peft" {
			h.streamFolder(r.Context(), w, r, folder.Dir, name, []string{peft.AdapterConfigFile, peft.AdapterWeightsFile}, time.Time{})
			return
		}
		release, err := h.exports.acquire(ws)
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		defer release()
		end := start.Add(ExportTimeout)
		ctx, cancel := context.WithDeadline(r.Context(), end)
		defer cancel()
		root := filepath.Join(h.opts.DataDir, exportFolder)
		if h.opts.DataDir == "" {
			h.edge.WriteError(w, r, internalErr("merged export", errNoDataDir))
			return
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			h.edge.WriteError(w, r, internalErr("creating the export folder", err))
			return
		}
		out, err := os.MkdirTemp(root, "merge-")
		if err != nil {
			h.edge.WriteError(w, r, internalErr("creating the export folder", err))
			return
		}
		defer os.RemoveAll(out)
		n, err := h.c.MergeAdapter(ctx, ck, folder.Dir, out, MaxExportBytes)
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		h.log.Info("merged export", slog.String("workspace", ws), slog.String("path", ck.GetTinkerPath()),
			slog.Int64("bytes", n), slog.Duration("merge", time.Since(start)))
		h.streamFolder(ctx, w, r, out, name, nil, end)
	})
}
