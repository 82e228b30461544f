package core

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ArchivePathPrefix is where checkpoint archives are served; the rest of the path is a
// short-lived token, so the download needs no API key (as the tinker CLI expects).
const ArchivePathPrefix = "/v1/checkpoint_archives/"

// Download links are bounded; past either limit, asking for a link is refused with
// ResourceExhausted (HTTP 429) until links expire (Options.ArchiveURLTTL).
const (
	// MaxArchiveLinksPerWorkspace is how many unexpired download links one workspace holds.
	MaxArchiveLinksPerWorkspace = 1000
	// MaxArchiveLinks is how many unexpired download links the server holds in all.
	MaxArchiveLinks = 20000
)

// GetCheckpointArchiveURL returns a short-lived URL path for a tar of the checkpoint.
func (s CheckpointService) GetCheckpointArchiveURL(ctx context.Context, req *loopsv1.GetCheckpointArchiveURLRequest) (*loopsv1.GetCheckpointArchiveURLResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, owner, err := s.c.resolveOwned(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := s.c.checkpointManifest(ctx, owner, ck); err != nil {
		return nil, err
	}
	t := s.c.archiveTarget(ws, owner, ck)
	t.name = strings.ReplaceAll(ck.GetTrainingRunId()+"-"+ck.GetId(), "/", "-")
	tok, err := s.c.archives.issue(t)
	if err != nil {
		return nil, err
	}
	return &loopsv1.GetCheckpointArchiveURLResponse{Url: ArchivePathPrefix + tok + ".tar", ExpireTime: timestamppb.New(t.expires)}, nil
}

// GetCheckpointFileURLs returns a short-lived URL path for each file of a checkpoint.
func (s CheckpointService) GetCheckpointFileURLs(ctx context.Context, req *loopsv1.GetCheckpointFileURLsRequest) (*loopsv1.GetCheckpointFileURLsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, owner, err := s.c.resolveOwned(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	m, err := s.c.checkpointManifest(ctx, owner, ck)
	if err != nil {
		return nil, err
	}
	out := &loopsv1.GetCheckpointFileURLsResponse{Urls: map[string]string{}}
	t := s.c.archiveTarget(ws, owner, ck)
	tok, err := s.c.archives.issue(t)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		if path.Base(f.Name) != completeMarker {
			out.Urls[f.Name] = ArchivePathPrefix + tok + "/" + f.Name
		}
	}
	out.ExpireTime = timestamppb.New(t.expires)
	return out, nil
}

// archiveTarget is what a download link serves: one generation of one checkpoint, for the
// workspace that asked for the link.
type archiveTarget struct {
	issuer string // the workspace the link was issued to
	owner  string // the checkpoint's workspace
	runID  string
	id     string // checkpoint id, "<kind>/<name>"
	gen    int64  // the checkpoint's generation when the link was issued
	path   string // tinker path, for messages
	// name is the archive's file name (without .tar).
	name    string
	expires time.Time
}

func (c *Core) archiveTarget(issuer, owner string, ck *loopsv1.Checkpoint) archiveTarget {
	return archiveTarget{
		issuer: issuer, owner: owner, runID: ck.GetTrainingRunId(), id: ck.GetId(), gen: generation(ck),
		path: ck.GetTinkerPath(), expires: c.now().Add(c.opts.ArchiveURLTTL),
	}
}

// archiveTokens holds the unexpired download links, bounded per workspace and in all.
type archiveTokens struct {
	now    func() time.Time
	mu     sync.Mutex
	tokens map[string]archiveTarget
	per    map[string]int // issuer -> links held
}

func newArchiveTokens() *archiveTokens {
	return &archiveTokens{now: time.Now, tokens: map[string]archiveTarget{}, per: map[string]int{}}
}

// issue stores a link target and returns its token.
func (a *archiveTokens) issue(t archiveTarget) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.tokens) >= MaxArchiveLinks || a.per[t.issuer] >= MaxArchiveLinksPerWorkspace {
		a.sweepLocked(a.now())
	}
	if n := a.per[t.issuer]; n >= MaxArchiveLinksPerWorkspace {
		return "", resourceExhausted("this workspace holds %d unexpired download links, the most allowed: retry after some expire (links live %s)", n, t.expires.Sub(a.now()).Round(time.Second))
	}
	if len(a.tokens) >= MaxArchiveLinks {
		return "", resourceExhausted("the server holds %d unexpired download links, the most allowed: retry later", len(a.tokens))
	}
	tok := randHex(24)
	a.tokens[tok] = t
	a.per[t.issuer]++
	return tok, nil
}

func (a *archiveTokens) get(tok string, now time.Time) (archiveTarget, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.tokens[tok]
	if !ok || now.After(t.expires) {
		return archiveTarget{}, false
	}
	return t, true
}

// revoke forgets a link.
func (a *archiveTokens) revoke(tok string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deleteLocked(tok)
}

func (a *archiveTokens) deleteLocked(tok string) {
	t, ok := a.tokens[tok]
	if !ok {
		return
	}
	delete(a.tokens, tok)
	if a.per[t.issuer]--; a.per[t.issuer] <= 0 {
		delete(a.per, t.issuer)
	}
}

func (a *archiveTokens) sweep(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweepLocked(now)
}

func (a *archiveTokens) sweepLocked(now time.Time) {
	for k, t := range a.tokens {
		if now.After(t.expires) {
			a.deleteLocked(k)
		}
	}
}

// checkpointManifest returns the manifest of a checkpoint record's files in the checkpoint
// store.
func (c *Core) checkpointManifest(ctx context.Context, owner string, ck *loopsv1.Checkpoint) (*ckstore.Manifest, error) {
	key, err := c.ckpt.recordKey(owner, ck)
	if err != nil {
		return nil, err
	}
	if err := c.ckpt.inside(key); err != nil {
		return nil, err
	}
	m, err := c.ckpt.st.Stat(ctx, key)
	switch {
	case errors.Is(err, ckstore.ErrNotFound):
		return nil, failedPrecondition("checkpoint %s has no complete files in the checkpoint store (it may have been deleted)", ck.GetTinkerPath())
	case err != nil:
		return nil, c.ckpt.internalFS("reading checkpoint "+key, err)
	}
	return m, nil
}

// linkKey checks, when a link is used, that it still grants access: the checkpoint exists
// with the generation the link was issued for, and the issuing workspace may still read it
// (it owns it, or it is still public). It returns the store key and manifest to serve, or
// the status and message to answer.
func (c *Core) linkKey(ctx context.Context, t archiveTarget) (string, *ckstore.Manifest, int, string) {
	ck, owner, err := c.store.GetCheckpointAnyWorkspace(ctx, t.runID, t.id)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && (owner != t.owner || generation(ck) != t.gen):
		return "", nil, http.StatusNotFound, fmt.Sprintf("checkpoint %s was deleted or saved again since this link was issued: ask for a new link", t.path)
	case err != nil:
		c.log.Error("looking up the checkpoint of a download link", slog.String("path", t.path), slog.Any("err", err))
		return "", nil, http.StatusInternalServerError, "internal error looking up the checkpoint: retry"
	case t.issuer != owner && !ck.GetPublic():
		return "", nil, http.StatusNotFound, fmt.Sprintf("checkpoint %s is no longer public, so this link no longer works", t.path)
	}
	m, err := c.checkpointManifest(ctx, owner, ck)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			return "", nil, http.StatusNotFound, fmt.Sprintf("checkpoint %s has no complete files on this server: ask for a new link", t.path)
		}
		c.log.Error("reading the checkpoint of a download link", slog.String("path", t.path), slog.Any("err", err))
		return "", nil, http.StatusInternalServerError, "internal error reading the checkpoint: retry"
	}
	key, _ := c.ckpt.recordKey(owner, ck) // checked by checkpointManifest
	return key, m, 0, ""
}

// ArchiveHandler serves checkpoint downloads: a tar of the checkpoint's files at
// ArchivePathPrefix + token + ".tar", and single files at ArchivePathPrefix + token + "/" +
// relative path, streamed from the checkpoint store (verified against its manifest: a
// corrupt file cuts the download short). Each use re-checks that the link's checkpoint
// generation still exists and that the workspace it was issued to may still read it.
func (c *Core) ArchiveHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest := strings.TrimPrefix(r.URL.Path, ArchivePathPrefix)
		tok, file, isFile := strings.Cut(rest, "/")
		tok = strings.TrimSuffix(tok, ".tar")
		t, ok := c.archives.get(tok, c.now())
		if !ok {
			writeDetail(w, http.StatusNotFound, "download link unknown or expired: ask for a new one")
			return
		}
		key, m, status, msg := c.linkKey(r.Context(), t)
		if status != 0 {
			if status == http.StatusNotFound {
				c.archives.revoke(tok)
			}
			writeDetail(w, status, msg)
			return
		}
		if isFile {
			f, ok := m.File(file)
			if !ok {
				writeDetail(w, http.StatusNotFound, "no such file in this checkpoint")
				return
			}
			rc, _, err := c.ckpt.st.Open(r.Context(), key, f.Name)
			if err != nil {
				c.log.Error("opening a checkpoint file for download", slog.String("key", key), slog.String("file", f.Name), slog.Any("err", err))
				writeDetail(w, http.StatusInternalServerError, "internal error reading the checkpoint: retry")
				return
			}
			defer rc.Close()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
			if r.Method == http.MethodHead {
				return
			}
			if _, err := io.Copy(w, rc); err != nil {
				c.log.Error("streaming a checkpoint file", slog.String("key", key), slog.String("file", f.Name), slog.Any("err", err))
				panic(http.ErrAbortHandler) // cut the response short: the client sees a failed download
			}
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", t.name+".tar"))
		if err := c.writeTar(r.Context(), w, key, m); err != nil {
			c.log.Error("writing checkpoint archive", slog.Any("err", err))
			panic(http.ErrAbortHandler)
		}
	})
}

// writeDetail answers an error with a JSON {"detail": msg} body.
func writeDetail(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(map[string]string{"detail": msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeTar writes the files of the checkpoint key (manifest m) as a tar stream with their
// relative paths, each streamed from the store.
func (c *Core) writeTar(ctx context.Context, w io.Writer, key string, m *ckstore.Manifest) error {
	tw := tar.NewWriter(w)
	for _, f := range m.Files {
		hdr := &tar.Header{Name: f.Name, Mode: 0o644, Size: f.Size, ModTime: m.Created, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		rc, _, err := c.ckpt.st.Open(ctx, key, f.Name)
		if err != nil {
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
