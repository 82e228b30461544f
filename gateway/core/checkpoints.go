package core

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// PathScheme is the scheme of checkpoint paths: tinker://<run>/weights/<name> for training
// checkpoints, tinker://<run>/sampler_weights/<name> for sampler checkpoints and
// tinker://<run>/external_weights/<name> for exported adapters.
const PathScheme = "tinker://"

// ephemeralTTL is how long an unnamed sampler checkpoint (save_weights_and_get_sampling_client)
// is kept.
const ephemeralTTL = 24 * time.Hour

// completeMarker is written last into a checkpoint folder; the tinker CLI checks for it.
const completeMarker = "checkpoint_complete"

func kindSegment(k loopsv1.CheckpointKind) string {
	switch k {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		return "sampler_weights"
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL:
		return "external_weights"
	}
	return "weights"
}

// ParsePath splits a checkpoint path into run id, kind and name.
func ParsePath(path string) (runID string, kind loopsv1.CheckpointKind, name string, err error) {
	rest, ok := strings.CutPrefix(path, PathScheme)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return "", 0, "", invalidArgument("checkpoint path %q is malformed: it looks like tinker://<run>/weights/<name> or tinker://<run>/sampler_weights/<name>", path)
	}
	switch parts[1] {
	case "weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING
	case "sampler_weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER
	case "external_weights":
		kind = loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL
	default:
		return "", 0, "", invalidArgument("checkpoint path %q has kind %q: use weights, sampler_weights or external_weights", path, parts[1])
	}
	if err := validateCheckpointName(parts[2]); err != nil {
		return "", 0, "", err
	}
	if strings.ContainsAny(parts[0], `\.`) {
		return "", 0, "", invalidArgument("checkpoint path %q has a malformed run id", path)
	}
	return parts[0], kind, parts[2], nil
}

func checkpointPath(runID string, kind loopsv1.CheckpointKind, name string) string {
	return PathScheme + runID + "/" + kindSegment(kind) + "/" + name
}

func (c *Core) checkpointDir(ws, runID string, kind loopsv1.CheckpointKind, name string) string {
	return filepath.Join(c.opts.DataDir, "checkpoints", ws, runID, kindSegment(kind), name)
}

// resolveCheckpoint finds a checkpoint the workspace may read (its own, or a public one)
// and its folder.
func (c *Core) resolveCheckpoint(ctx context.Context, ws, path string) (*loopsv1.Checkpoint, string, error) {
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, "", err
	}
	runID = c.canonicalRunID(ws, runID)
	ck, owner, err := c.store.GetCheckpointAnyWorkspace(ctx, runID, kindSegment(kind)+"/"+name)
	if err == nil && owner != ws && !ck.GetPublic() {
		err = store.ErrNotFound
	}
	if err != nil {
		return nil, "", storeErr(err, "checkpoint "+path)
	}
	dir := c.checkpointDir(owner, runID, kind, name)
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err != nil {
		return nil, "", failedPrecondition("checkpoint %s has no complete files on this server (it may have been deleted)", path)
	}
	return ck, dir, nil
}

// saveCheckpoint writes a checkpoint of the run. A folder is written under a temporary name
// and renamed into place, so a reader never sees half a checkpoint.
func (c *Core) saveCheckpoint(ctx context.Context, r *run, req *loopsv1.SaveWeightsRequest, seq int64) (func(*loopsv1.Operation), error) {
	kind, name := req.GetKind(), req.GetName()
	ephemeral := kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER && name == ""
	if ephemeral {
		name = fmt.Sprintf("ephemeral-%06d-%s", seq, randHex(4))
	}
	id := kindSegment(kind) + "/" + name
	if _, err := c.store.GetCheckpoint(ctx, r.ws, r.id, id); err == nil && !req.GetOverwrite() {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("checkpoint %s already exists: pick another name or pass overwrite=True", checkpointPath(r.id, kind, name)))
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, internal("looking up checkpoint", err)
	}
	dir := c.checkpointDir(r.ws, r.id, kind, name)
	tmp := dir + ".tmp-" + randHex(6)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, internal("creating checkpoint folder", err)
	}
	if _, err := c.backend.Trainer().SaveAdapter(ctx, &backendv1.SaveAdapterRequest{
		AdapterId: r.id, Dir: tmp, IncludeOptimizer: kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
	}); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, r.adapterLost(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), nil, 0o644); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, internal("writing checkpoint marker", err)
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, internal("moving checkpoint into place", err)
	}
	info := r.snapshot()
	now := c.now()
	ck := &loopsv1.Checkpoint{
		Id:            id,
		TrainingRunId: r.id,
		Kind:          kind,
		Name:          name,
		TinkerPath:    checkpointPath(r.id, kind, name),
		SizeBytes:     dirSize(dir),
		CreateTime:    timestamppb.New(now),
		BaseModel:     info.GetBaseModel(),
		Lora:          info.GetLora(),
	}
	switch {
	case req.TtlSeconds != nil:
		ck.ExpireTime = timestamppb.New(now.Add(time.Duration(req.GetTtlSeconds()) * time.Second))
	case ephemeral:
		ck.ExpireTime = timestamppb.New(now.Add(ephemeralTTL))
	}
	if err := c.store.PutCheckpoint(ctx, r.ws, ck); err != nil {
		return nil, internal("recording checkpoint", err)
	}
	r.update(ctx, func(i *loopsv1.TrainingRun) {
		switch kind {
		case loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING:
			i.LastCheckpoint = ck
		case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
			i.LastSamplerCheckpoint = ck
		}
	})
	res := &loopsv1.SaveWeightsResult{Path: ck.TinkerPath, Checkpoint: ck}
	if ephemeral {
		s, err := c.samplers.create(ctx, r.ws, info.GetSessionId(), info.GetBaseModel(), ck.TinkerPath, dir)
		if err != nil {
			return nil, err
		}
		res.SamplerId = s.GetId()
	}
	c.recordUsage(r.ws, info.GetBaseModel(), info.GetSessionId(), store.UsageCheckpoint, 1)
	return func(op *loopsv1.Operation) { op.Result = &loopsv1.Operation_SaveWeights{SaveWeights: res} }, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// expireCheckpoints deletes checkpoints whose TTL has passed.
func (c *Core) expireCheckpoints(ctx context.Context, now time.Time) {
	expired, err := c.store.ListExpiredCheckpoints(ctx, now)
	if err != nil {
		c.log.Error("listing expired checkpoints", slog.Any("err", err))
		return
	}
	for _, e := range expired {
		if err := c.deleteCheckpoint(ctx, e.Workspace, e.Checkpoint); err != nil {
			c.log.Error("deleting expired checkpoint", slog.String("path", e.Checkpoint.GetTinkerPath()), slog.Any("err", err))
		}
	}
}

func (c *Core) deleteCheckpoint(ctx context.Context, ws string, ck *loopsv1.Checkpoint) error {
	if err := c.store.DeleteCheckpoint(ctx, ws, ck.GetTrainingRunId(), ck.GetId()); err != nil {
		return err
	}
	return os.RemoveAll(c.checkpointDir(ws, ck.GetTrainingRunId(), ck.GetKind(), ck.GetName()))
}

// CheckpointService implements loops.v1 CheckpointService.
type CheckpointService struct{ c *Core }

// ListCheckpoints lists checkpoints of one run or of the workspace.
func (s CheckpointService) ListCheckpoints(ctx context.Context, req *loopsv1.ListCheckpointsRequest) (*loopsv1.ListCheckpointsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	page, err := pageOf(req.GetLimit(), req.GetOffset())
	if err != nil {
		return nil, err
	}
	runID := s.c.canonicalRunID(ws, req.GetTrainingRunId())
	if runID != "" {
		if _, err := s.c.store.GetTrainingRun(ctx, ws, runID); err != nil {
			return nil, storeErr(err, "training run "+quote(runID))
		}
	}
	cks, total, err := s.c.store.ListCheckpoints(ctx, ws, runID, page)
	if err != nil {
		return nil, internal("listing checkpoints", err)
	}
	return &loopsv1.ListCheckpointsResponse{Checkpoints: cks, TotalCount: total}, nil
}

// GetCheckpoint returns a checkpoint the caller may read.
func (s CheckpointService) GetCheckpoint(ctx context.Context, req *loopsv1.GetCheckpointRequest) (*loopsv1.Checkpoint, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, _, err := s.c.resolveCheckpoint(ctx, ws, req.GetPath())
	return ck, err
}

// owned returns a checkpoint that the workspace owns (public ones of others are read-only).
func (s CheckpointService) owned(ctx context.Context, ws, path string) (*loopsv1.Checkpoint, error) {
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, err
	}
	ck, err := s.c.store.GetCheckpoint(ctx, ws, s.c.canonicalRunID(ws, runID), kindSegment(kind)+"/"+name)
	if err != nil {
		return nil, storeErr(err, "checkpoint "+path)
	}
	return ck, nil
}

// DeleteCheckpoint deletes a checkpoint and its files.
func (s CheckpointService) DeleteCheckpoint(ctx context.Context, req *loopsv1.DeleteCheckpointRequest) (*loopsv1.DeleteCheckpointResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, err := s.owned(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	if err := s.c.deleteCheckpoint(ctx, ws, ck); err != nil {
		return nil, internal("deleting checkpoint", err)
	}
	return &loopsv1.DeleteCheckpointResponse{}, nil
}

// SetCheckpointPublic publishes or unpublishes a checkpoint.
func (s CheckpointService) SetCheckpointPublic(ctx context.Context, req *loopsv1.SetCheckpointPublicRequest) (*loopsv1.Checkpoint, error) {
	return s.modify(ctx, req.GetPath(), func(ck *loopsv1.Checkpoint) error {
		ck.Public = req.GetPublic()
		return nil
	})
}

// SetCheckpointTTL sets or clears a checkpoint's expiry.
func (s CheckpointService) SetCheckpointTTL(ctx context.Context, req *loopsv1.SetCheckpointTTLRequest) (*loopsv1.Checkpoint, error) {
	return s.modify(ctx, req.GetPath(), func(ck *loopsv1.Checkpoint) error {
		if req.TtlSeconds == nil {
			ck.ExpireTime = nil
			return nil
		}
		if req.GetTtlSeconds() <= 0 {
			return invalidArgument("ttl_seconds must be positive (send null to remove the expiry), got %d", req.GetTtlSeconds())
		}
		ck.ExpireTime = timestamppb.New(s.c.now().Add(time.Duration(req.GetTtlSeconds()) * time.Second))
		return nil
	})
}

func (s CheckpointService) modify(ctx context.Context, path string, f func(*loopsv1.Checkpoint) error) (*loopsv1.Checkpoint, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, err := s.owned(ctx, ws, path)
	if err != nil {
		return nil, err
	}
	next := proto.CloneOf(ck)
	if err := f(next); err != nil {
		return nil, err
	}
	if err := s.c.store.PutCheckpoint(ctx, ws, next); err != nil {
		return nil, internal("updating checkpoint", err)
	}
	return next, nil
}

// ArchivePathPrefix is where checkpoint archives are served; the rest of the path is a
// short-lived token, so the download needs no API key (as the tinker CLI expects).
const ArchivePathPrefix = "/v1/checkpoint_archives/"

// GetCheckpointArchiveURL returns a short-lived URL path for a tar of the checkpoint.
func (s CheckpointService) GetCheckpointArchiveURL(ctx context.Context, req *loopsv1.GetCheckpointArchiveURLRequest) (*loopsv1.GetCheckpointArchiveURLResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, dir, err := s.c.resolveCheckpoint(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	exp := s.c.now().Add(s.c.opts.ArchiveURLTTL)
	tok := s.c.archives.issue(archiveTarget{dir: dir, name: strings.ReplaceAll(ck.GetTrainingRunId()+"-"+ck.GetId(), "/", "-"), expires: exp})
	return &loopsv1.GetCheckpointArchiveURLResponse{Url: ArchivePathPrefix + tok + ".tar", ExpireTime: timestamppb.New(exp)}, nil
}

// GetCheckpointFileURLs returns a short-lived URL path for each file of a checkpoint.
func (s CheckpointService) GetCheckpointFileURLs(ctx context.Context, req *loopsv1.GetCheckpointFileURLsRequest) (*loopsv1.GetCheckpointFileURLsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	_, dir, err := s.c.resolveCheckpoint(ctx, ws, req.GetPath())
	if err != nil {
		return nil, err
	}
	exp := s.c.now().Add(s.c.opts.ArchiveURLTTL)
	tok := s.c.archives.issue(archiveTarget{dir: dir, expires: exp})
	out := &loopsv1.GetCheckpointFileURLsResponse{Urls: map[string]string{}, ExpireTime: timestamppb.New(exp)}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || d.Name() == completeMarker {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		out.Urls[rel] = ArchivePathPrefix + tok + "/" + rel
		return nil
	})
	if err != nil {
		return nil, internal("listing checkpoint files", err)
	}
	return out, nil
}

type archiveTarget struct {
	dir     string
	name    string
	expires time.Time
}

type archiveTokens struct {
	mu     sync.Mutex
	tokens map[string]archiveTarget
}

func newArchiveTokens() *archiveTokens { return &archiveTokens{tokens: map[string]archiveTarget{}} }

func (a *archiveTokens) issue(t archiveTarget) string {
	tok := randHex(24)
	a.mu.Lock()
	a.tokens[tok] = t
	a.mu.Unlock()
	return tok
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

func (a *archiveTokens) sweep(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, t := range a.tokens {
		if now.After(t.expires) {
			delete(a.tokens, k)
		}
	}
}

// ArchiveHandler serves checkpoint downloads: a tar of the folder at ArchivePathPrefix +
// token + ".tar", and single files at ArchivePathPrefix + token + "/" + relative path.
func (c *Core) ArchiveHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest := strings.TrimPrefix(r.URL.Path, ArchivePathPrefix)
		tok, file, isFile := strings.Cut(rest, "/")
		tok = strings.TrimSuffix(tok, ".tar")
		t, ok := c.archives.get(tok, c.now())
		if !ok {
			http.Error(w, `{"detail":"download link unknown or expired: ask for a new one"}`, http.StatusNotFound)
			return
		}
		if isFile {
			// The file must be a regular file inside the checkpoint folder.
			clean := filepath.Clean(filepath.FromSlash(file))
			if file == "" || filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
				http.Error(w, `{"detail":"no such file in this checkpoint"}`, http.StatusNotFound)
				return
			}
			p := filepath.Join(t.dir, clean)
			if info, err := os.Lstat(p); err != nil || !info.Mode().IsRegular() {
				http.Error(w, `{"detail":"no such file in this checkpoint"}`, http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			http.ServeFile(w, r, p)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", t.name+".tar"))
		if err := writeTar(w, t.dir); err != nil {
			c.log.Error("writing checkpoint archive", slog.Any("err", err))
		}
	})
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
