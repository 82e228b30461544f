package ckhttp

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/core"
)

// Archives serves download links: a tar of the checkpoint's files at ArchivePrefix +
// token + ".tar", and single files at ArchivePrefix + token + "/" + relative path, streamed
// from the checkpoint store (verified against its manifest: a corrupt file cuts the
// download short). Each use re-checks, through the core, that the link's checkpoint
// generation still exists and that the workspace it was issued to may still read it. A
// download slower than the minimum rate is cut.
func (h *Handlers) Archives() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest := strings.TrimPrefix(r.URL.Path, ArchivePrefix)
		tok, file, isFile := strings.Cut(rest, "/")
		tok = strings.TrimSuffix(tok, ".tar")
		link, err := h.c.OpenArchiveLink(r.Context(), tok)
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		if isFile {
			f, ok := link.Manifest.File(file)
			if !ok {
				h.edge.WriteError(w, r, &detailError{http.StatusNotFound, "no such file in this checkpoint"})
				return
			}
			rc, size, err := h.c.OpenArchiveFile(r.Context(), link, f.Name)
			if err != nil {
				h.edge.WriteError(w, r, err)
				return
			}
			defer rc.Close()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			if r.Method == http.MethodHead {
				return
			}
			out := h.sendStream(w, "the download", time.Time{})
			defer out.done()
			if _, err := io.Copy(out, rc); err != nil {
				h.abort("streaming a checkpoint file", err, slog.String("path", link.Path), slog.String("file", f.Name))
			}
			return
		}
		// a weights file Tinker's layout cannot express (core.OpenArchiveFile refuses it) is
		// refused before the archive starts, as a clear error rather than a cut stream
		if f, ok := link.Manifest.File(peft.AdapterWeightsFile); ok {
			rc, _, err := h.c.OpenArchiveFile(r.Context(), link, f.Name)
			if err != nil {
				h.edge.WriteError(w, r, err)
				return
			}
			rc.Close()
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", link.Name+".tar"))
		out := h.sendStream(w, "the download", time.Time{})
		defer out.done()
		if err := h.writeTar(r.Context(), out, link); err != nil {
			h.abort("writing a checkpoint archive", err, slog.String("path", link.Path))
		}
	})
}

// writeTar writes the files of a link's manifest as a tar stream with their relative
// paths, each streamed from the store.
func (h *Handlers) writeTar(ctx context.Context, w io.Writer, link core.ArchiveLink) error {
	tw := tar.NewWriter(w)
	for _, f := range link.Manifest.Files {
		rc, size, err := h.c.OpenArchiveFile(ctx, link, f.Name)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: f.Name, Mode: 0o644, Size: size, ModTime: link.Manifest.Created, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			rc.Close()
			return err
		}
		_, err = io.Copy(tw, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
