package core

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/loops-dev/loops/gateway/auth"
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
	ck, owner, _, err := s.c.resolveOwned(ctx, ws, req.GetPath())
	if err != nil {
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
	ck, owner, dir, err := s.c.resolveOwned(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	out := &loopsv1.GetCheckpointFileURLsResponse{Urls: map[string]string{}}
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || d.Name() == completeMarker {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, s.c.ckpt.internalFS("listing checkpoint files", err)
	}
	t := s.c.archiveTarget(ws, owner, ck)
	tok, err := s.c.archives.issue(t)
	if err != nil {
		return nil, err
	}
	for _, rel := range files {
		out.Urls[rel] = ArchivePathPrefix + tok + "/" + rel
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

// linkFolder checks, when a link is used, that it still grants access: the checkpoint
// exists with the generation the link was issued for, and the issuing workspace may still
// read it (it owns it, or it is still public). It returns the folder to serve, or the
// status and message to answer.
func (c *Core) linkFolder(ctx context.Context, t archiveTarget) (string, int, string) {
	ck, owner, err := c.store.GetCheckpointAnyWorkspace(ctx, t.runID, t.id)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && (owner != t.owner || generation(ck) != t.gen):
		return "", http.StatusNotFound, fmt.Sprintf("checkpoint %s was deleted or saved again since this link was issued: ask for a new link", t.path)
	case err != nil:
		c.log.Error("looking up the checkpoint of a download link", slog.String("path", t.path), slog.Any("err", err))
		return "", http.StatusInternalServerError, "internal error looking up the checkpoint: retry"
	case t.issuer != owner && !ck.GetPublic():
		return "", http.StatusNotFound, fmt.Sprintf("checkpoint %s is no longer public, so this link no longer works", t.path)
	}
	dir, err := c.checkpointFolder(owner, ck)
	if err != nil {
		return "", http.StatusNotFound, fmt.Sprintf("checkpoint %s has no complete files on this server: ask for a new link", t.path)
	}
	return dir, 0, ""
}

// ArchiveHandler serves checkpoint downloads: a tar of the folder at ArchivePathPrefix +
// token + ".tar", and single files at ArchivePathPrefix + token + "/" + relative path. Each
// use re-checks that the link's checkpoint generation still exists and that the workspace
// it was issued to may still read it.
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
		dir, status, msg := c.linkFolder(r.Context(), t)
		if status != 0 {
			if status == http.StatusNotFound {
				c.archives.revoke(tok)
			}
			writeDetail(w, status, msg)
			return
		}
		if isFile {
			// The file must be a regular file inside the checkpoint folder.
			clean := filepath.Clean(filepath.FromSlash(file))
			if file == "" || filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
				writeDetail(w, http.StatusNotFound, "no such file in this checkpoint")
				return
			}
			p := filepath.Join(dir, clean)
			if info, err := os.Lstat(p); err != nil || !info.Mode().IsRegular() {
				writeDetail(w, http.StatusNotFound, "no such file in this checkpoint")
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			http.ServeFile(w, r, p)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", t.name+".tar"))
		if err := writeTar(w, dir); err != nil {
			c.log.Error("writing checkpoint archive", slog.Any("err", err))
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

// writeTar writes the regular files under dir as a tar stream with paths relative to dir.
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: info.Size(), ModTime: info.ModTime(), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
