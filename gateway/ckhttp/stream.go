package ckhttp

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// stream is a response body written under the minimum rate (rateWriter).
type stream struct {
	*rateWriter
	rc *http.ResponseController
}

// sendStream starts a response body of what (for messages) under the minimum rate, never
// past end when it is set. Call done when the body is written.
func (h *Handlers) sendStream(w http.ResponseWriter, what string, end time.Time) *stream {
	rc := http.NewResponseController(w)
	m := newMinRate(rc.SetWriteDeadline, h.opts.MinRate, h.opts.RateWindow, end)
	return &stream{rateWriter: &rateWriter{w: w, m: m, what: what}, rc: rc}
}

// done sends what is still buffered while the deadline holds, then clears it: an HTTP/1.1
// connection may serve another request.
func (s *stream) done() {
	_ = s.rc.Flush()
	s.m.stop()
}

// abort ends a response cut midway (the client sees a failed download): a transfer cut for
// its rate is logged as such, a client that went away at debug level, any other failure as
// an error.
func (h *Handlers) abort(what string, err error, attrs ...any) {
	var cut *cutError
	switch {
	case errors.As(err, &cut):
		h.log.Info("checkpoint transfer cut", append(attrs, slog.String("why", cut.msg))...)
	case errors.Is(err, context.Canceled), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		h.log.Debug(what+": the client went away", append(attrs, slog.Any("err", err))...)
	default:
		h.log.Error(what, append(attrs, slog.Any("err", err))...)
	}
	panic(http.ErrAbortHandler)
}

// streamFolder writes the regular files of dir (those named in only, or all of them,
// sorted) as a tar stream named name.tar, under the minimum rate and never past end. A
// failure midway cuts the response short: the client sees a broken download.
func (h *Handlers) streamFolder(ctx context.Context, w http.ResponseWriter, r *http.Request, dir, name string, only []string, end time.Time) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		h.edge.WriteError(w, r, internalErr("reading the export folder", err))
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
	out := h.sendStream(w, "the export", end)
	defer out.done()
	tw := tar.NewWriter(out)
	for _, fi := range files {
		if err := ctx.Err(); err != nil {
			h.abort("streaming an export", err, slog.String("export", name))
		}
		if err := tw.WriteHeader(&tar.Header{Name: fi.Name(), Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime(), Typeflag: tar.TypeReg}); err != nil {
			h.abort("streaming an export", err, slog.String("export", name))
		}
		f, err := os.Open(filepath.Join(dir, fi.Name()))
		if err != nil {
			h.abort("opening an export file", err, slog.String("file", fi.Name()))
		}
		_, err = io.CopyN(tw, f, fi.Size())
		f.Close()
		if err != nil {
			h.abort("streaming an export", err, slog.String("export", name))
		}
	}
	if err := tw.Close(); err != nil {
		h.abort("streaming an export", err, slog.String("export", name))
	}
}
