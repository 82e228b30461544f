package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/tinkerlayout"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ArchivePathPrefix is where checkpoint archives are served (gateway/ckhttp): the links
// this core issues are ArchivePathPrefix + token + ".tar" for a tar of the checkpoint and
// ArchivePathPrefix + token + "/" + file for one file. The token is short-lived, so the
// download needs no API key (as the tinker CLI expects).
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
		if path.Base(f.Name) != ckfiles.CompleteMarker {
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
		issuer: issuer, owner: owner, runID: ck.GetTrainingRunId(), id: ck.GetId(), gen: ckfiles.Generation(ck),
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
	key, err := ckfiles.RecordKey(owner, ck)
	if err != nil {
		return nil, err
	}
	if err := c.ckpt.Inside(key); err != nil {
		return nil, err
	}
	m, err := c.ckpt.Store().Stat(ctx, key)
	switch {
	case errors.Is(err, ckstore.ErrNotFound):
		return nil, failedPrecondition("checkpoint %s has no complete files in the checkpoint store (it may have been deleted)", ck.GetTinkerPath())
	case err != nil:
		return nil, c.ckpt.Internal("reading checkpoint "+key, err)
	}
	return m, nil
}

// ArchiveLink is a download link in use (OpenArchiveLink): one generation of one
// checkpoint, with its files.
type ArchiveLink struct {
	// Name is the archive's file name, without ".tar".
	Name string
	// Path is the checkpoint's tinker path.
	Path string
	// Manifest lists the generation's files in the checkpoint store (the
	// checkpoint_complete marker included), with their sizes.
	Manifest *ckstore.Manifest
	key      string // the generation's store key
}

// OpenArchiveLink returns what the download link token grants, checked now: the
// checkpoint still exists with the generation the link was issued for, and the workspace it
// was issued to may still read it (it owns it, or it is still public). A link that no
// longer grants anything is NotFound, with a message that says why, and is forgotten; an
// unknown or expired token is NotFound too. A store failure is Internal.
func (c *Core) OpenArchiveLink(ctx context.Context, token string) (ArchiveLink, error) {
	t, ok := c.archives.get(token, c.now())
	if !ok {
		return ArchiveLink{}, notFound("download link unknown or expired: ask for a new one")
	}
	key, m, err := c.linkKey(ctx, t)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			c.archives.revoke(token)
		}
		return ArchiveLink{}, err
	}
	return ArchiveLink{Name: t.name, Path: t.path, Manifest: m, key: key}, nil
}

// OpenArchiveFile opens the file name of a link's manifest (ArchiveLink.Manifest) in the
// checkpoint store, in Tinker's adapter layout (backends/tinkerlayout), which the tinker
// CLI downloads and tinker-cookbook's weights tools read: safetensors files have their
// tensors renamed (the unembedding's LoRA is model.unembed_tokens) and adapter_config.json
// its target_modules; other files, and adapters without an unembedding LoRA, are served as
// stored. It returns the reader and the size it yields; the reader fails if the stored
// bytes do not match the manifest.
func (c *Core) OpenArchiveFile(ctx context.Context, link ArchiveLink, name string) (io.ReadCloser, int64, error) {
	if link.key == "" || link.Manifest == nil {
		return nil, 0, notFound("no such file in this checkpoint")
	}
	f, ok := link.Manifest.File(name)
	if !ok {
		return nil, 0, notFound("no such file in this checkpoint")
	}
	rc, _, err := c.ckpt.Store().Open(ctx, link.key, name)
	if err != nil {
		return nil, 0, internal("opening checkpoint file "+link.key+"/"+name, err)
	}
	ex, err := c.archiveCheckpoint(ctx, link, name)
	if err != nil {
		rc.Close()
		return nil, 0, err
	}
	r, size, err := tinkerFile(rc, name, f.Size, ex)
	if errors.Is(err, tinkerlayout.ErrHeadOnlyTied) || errors.Is(err, tinkerlayout.ErrNoTinkerLayout) {
		rc.Close()
		return nil, 0, failedPrecondition("%s: %v", name, err)
	}
	if r == nil {
		rc.Close()
		return nil, 0, internal("reading checkpoint file "+link.key+"/"+name, err)
	}
	if err != nil {
		// Served as stored: every backend writes files this conversion reads, so this is a
		// file of some other kind (its reader still verifies it against the manifest).
		c.log.Warn("serving a checkpoint file as stored: it is not in a layout that converts to Tinker's", slog.String("key", link.key), slog.String("file", name), slog.Any("err", err))
	}
	return readCloser{r, rc}, size, nil
}

// tinkerFile converts the stored checkpoint file name of size bytes that r streams to
// Tinker's layout (OpenArchiveFile). With an error and a reader, the reader and size are
// the file as stored (it could not be converted); with an error and no reader, the store
// failed.
func tinkerFile(r io.Reader, name string, size int64, ex tinkerlayout.Checkpoint) (io.Reader, int64, error) {
	switch {
	case strings.HasSuffix(name, ".safetensors"):
		rn, err := tinkerlayout.ToTinker(r, size, ex)
		return rn, rn.Size, err
	case path.Base(name) == peft.AdapterConfigFile && size <= peft.MaxConfigBytes:
		b, err := io.ReadAll(io.LimitReader(r, size+1))
		if err != nil {
			return nil, 0, err // the store's reader failed
		}
		nb, _, err := tinkerlayout.RenameTargetModules(b, tinkerlayout.TinkerModules)
		if lay, moe := tinkerlayout.ExpertFamilies[ex.Family]; err == nil && moe {
			nb, err = tinkerlayout.ExpertConfigToTinker(nb, lay)
		}
		if err != nil {
			return bytes.NewReader(b), size, err
		}
		return bytes.NewReader(nb), int64(len(nb)), nil
	}
	return r, size, nil
}

// archiveCheckpoint reads what converting the file name of a link's checkpoint needs to
// know beyond the file (tinkerlayout.Checkpoint): r and ensure_weight_tying from the
// adapter_config.json beside it, and the base model's family, language model prefix and
// tied embeddings (zero when there is no config, or it does not parse: the conversion then
// refuses an expert LoRA).
func (c *Core) archiveCheckpoint(ctx context.Context, link ArchiveLink, name string) (tinkerlayout.Checkpoint, error) {
	cfgName := path.Join(path.Dir(name), peft.AdapterConfigFile)
	f, ok := link.Manifest.File(cfgName)
	if !ok || f.Size > peft.MaxConfigBytes {
		return tinkerlayout.Checkpoint{}, nil
	}
	rc, _, err := c.ckpt.Store().Open(ctx, link.key, cfgName)
	if err != nil {
		return tinkerlayout.Checkpoint{}, internal("opening checkpoint file "+link.key+"/"+cfgName, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, peft.MaxConfigBytes+1))
	if err != nil {
		return tinkerlayout.Checkpoint{}, internal("reading checkpoint file "+link.key+"/"+cfgName, err)
	}
	var cfg struct {
		Base string `json:"base_model_name_or_path"`
	}
	_ = json.Unmarshal(b, &cfg)
	ck, _ := tinkerlayout.CheckpointFromConfig(b, tinkerBase(c.models[cfg.Base]))
	return ck, nil
}

// tinkerBase is what converting adapters to and from Tinker's layout needs to know of base
// model m (nil: nothing).
func tinkerBase(m *loopsv1.ModelInfo) tinkerlayout.Base {
	return tinkerlayout.Base{Family: m.GetFamily(), LanguageModelPrefix: m.GetLanguageModelPrefix(), TiedEmbeddings: m.GetTiedEmbeddings()}
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// linkKey checks, when a link is used, that it still grants access (see OpenArchiveLink).
// It returns the store key and manifest to serve.
func (c *Core) linkKey(ctx context.Context, t archiveTarget) (string, *ckstore.Manifest, error) {
	ck, owner, err := c.store.GetCheckpointAnyWorkspace(ctx, t.runID, t.id)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && (owner != t.owner || ckfiles.Generation(ck) != t.gen):
		return "", nil, notFound("checkpoint %s was deleted or saved again since this link was issued: ask for a new link", t.path)
	case err != nil:
		return "", nil, internal("looking up the checkpoint of a download link "+t.path, err)
	case t.issuer != owner && !ck.GetPublic():
		return "", nil, notFound("checkpoint %s is no longer public, so this link no longer works", t.path)
	}
	m, err := c.checkpointManifest(ctx, owner, ck)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			return "", nil, notFound("checkpoint %s has no complete files on this server: ask for a new link", t.path)
		}
		return "", nil, internal("reading the checkpoint of a download link "+t.path, err)
	}
	key, _ := ckfiles.RecordKey(owner, ck) // checked by checkpointManifest
	return key, m, nil
}
