package ckhttp

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
)

// importFiles are the files an import takes, with their caps.
var importFiles = map[string]int64{
	peft.AdapterConfigFile:  peft.MaxConfigBytes,
	peft.AdapterWeightsFile: MaxImportBytes,
}

// maxTrailingBytes is how much a body may hold after the end of its tar archive: tar
// writers pad an archive to a whole record (10 KiB for GNU tar and Python's tarfile).
const maxTrailingBytes = 64 << 10

// Import serves ImportPath. An import takes one of the import slots (429 past the
// server's or the workspace's share) until it is answered. Its body is read under its own
// deadline, which replaces the server's body read timeout once the handler runs:
// ImportTimeout, and the minimum rate all along.
func (h *Handlers) Import() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 {
			// An answer may come before the body's end (a refusal, a bad archive, a cut):
			// the connection closes after it, rather than have the server read the rest of
			// the body however slowly it comes before sending the answer. Imports are few
			// and large; the next request opens a new connection.
			w.Header().Set("Connection", "close")
		}
		ws, err := auth.RequireWorkspace(r.Context())
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		release, err := h.imports.acquire(ws)
		if err != nil {
			h.edge.WriteError(w, r, err)
			return
		}
		defer release()
		end := time.Now().Add(ImportTimeout)
		ctx, cancel := context.WithDeadline(r.Context(), end)
		defer cancel()
		rc := http.NewResponseController(w)
		body := &rateReader{r: r.Body, what: "the import", m: newMinRate(rc.SetReadDeadline, h.opts.MinRate, h.opts.RateWindow, end)}
		q := r.URL.Query()
		ck, err := h.c.ImportAdapter(ctx, core.ImportRequest{Workspace: ws, BaseModel: q.Get("base_model"), Name: q.Get("name")},
			func(dir string) error {
				return untarAdapter(http.MaxBytesReader(w, io.NopCloser(body), MaxImportBytes), dir)
			})
		var mb *http.MaxBytesError
		var cut *cutError
		switch {
		case errors.As(err, &mb):
			h.edge.WriteError(w, r, &detailError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the import is over %d bytes", int64(MaxImportBytes))})
			return
		case errors.As(err, &cut):
			h.edge.WriteError(w, r, &detailError{http.StatusRequestTimeout, cut.msg})
			return
		case err != nil:
			h.edge.WriteError(w, r, err)
			return
		}
		b, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ck)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
}

// sparse reports whether a tar entry is a sparse file (old GNU or GNU PAX format).
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// heldWriter writes an entry's bytes, refusing to write more than the body held since
// the entry began (in.n - start): bytes a tar reader makes up are not taken.
type heldWriter struct {
	w     io.Writer
	in    *countingReader
	start int64
	n     int64
}

func (h *heldWriter) Write(p []byte) (int, error) {
	if h.n+int64(len(p)) > h.in.n-h.start {
		return 0, invalidArgument("an entry of the import holds more bytes than the body sent for it (a sparse file?): send regular files")
	}
	n, err := h.w.Write(p)
	h.n += int64(n)
	return n, err
}

// transferErr reports whether err is the transfer's own failure (over the size limit, or
// cut for its rate), which the handler answers itself.
func transferErr(err error) bool {
	var mb *http.MaxBytesError
	var cut *cutError
	return errors.As(err, &mb) || errors.As(err, &cut)
}

// untarAdapter writes the adapter files of a tar stream into dir: adapter_config.json and
// adapter_model.safetensors, each within its cap; any other entry is refused, and both are
// required. What follows the end of the archive is read too, up to maxTrailingBytes.
//
// An entry never writes more bytes than the body held for it: a sparse file (its holes
// expand to zeros that the body does not hold, up to the entry's declared size) is refused.
func untarAdapter(body io.Reader, dir string) error {
	in := &countingReader{r: body}
	tr := tar.NewReader(in)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if transferErr(err) {
				return err
			}
			return invalidArgument("the body is not a tar archive of an adapter folder: %v", err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		base := filepath.Base(h.Name)
		if err := core.MergedModelFile(base); err != nil {
			return err
		}
		limit, ok := importFiles[base]
		if ok && sparse(h) {
			return invalidArgument("%s is a sparse file: send it as a regular file", base)
		}
		if !ok || h.Typeflag != tar.TypeReg {
			return invalidArgument("the import holds %.80q: send only %s and %s", h.Name, peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
		if seen[base] {
			return invalidArgument("the import holds %s twice", base)
		}
		seen[base] = true
		if h.Size > limit {
			return invalidArgument("%s is %d bytes, over the %d-byte limit", base, h.Size, limit)
		}
		out, err := os.Create(filepath.Join(dir, base))
		if err != nil {
			return internalErr("writing the import", err)
		}
		_, err = io.Copy(&heldWriter{w: out, in: in, start: in.n}, io.LimitReader(tr, limit))
		if cerr := out.Close(); err == nil && cerr != nil {
			return internalErr("writing the import", cerr)
		}
		if err != nil {
			if transferErr(err) {
				return err
			}
			if connect.CodeOf(err) == connect.CodeInvalidArgument {
				return err
			}
			return invalidArgument("reading %s from the import: %v", base, err)
		}
	}
	for f := range importFiles {
		if !seen[f] {
			return invalidArgument("the import has no %s: send a PEFT adapter folder (%s and %s)", f, peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
	}
	n, err := io.Copy(io.Discard, io.LimitReader(body, maxTrailingBytes+1))
	switch {
	case err != nil && transferErr(err):
		return err
	case err != nil:
		return invalidArgument("reading the end of the import: %v", err)
	case n > maxTrailingBytes:
		return invalidArgument("the body goes on for more than %d bytes after the end of the tar archive: send the archive alone", maxTrailingBytes)
	}
	return nil
}
