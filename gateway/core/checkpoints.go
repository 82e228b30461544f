package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Checkpoint files are kept by package ckfiles (keys, generations, readers' folders, the
// sweep of unreferenced keys, the migration of the old folder layout). The core's side is
// here: a save has the backend write a staging folder (or upload through presigned URLs),
// puts it into the checkpoint store as a new generation, then replaces the record, then
// deletes the previous generation; a delete deletes the record, then the generation. Each
// of these steps (ckStep) can be failed by a test hook (Core.ckFault) to check that a
// crash at any step leaves the old or the new checkpoint, complete and listed.

// ckStep names a step of a checkpoint save or delete.
type ckStep string

// The steps of saves and deletes, in order.
const (
	stepSaveMkdir   ckStep = "save: create the staging folder"
	stepSaveWrite   ckStep = "save: backend writes the staging folder"
	stepSaveMarker  ckStep = "save: write the checkpoint_complete marker"
	stepSavePut     ckStep = "save: put the files into the checkpoint store"
	stepSaveRecord  ckStep = "save: replace the store record"
	stepSaveRemove  ckStep = "save: delete the previous generation"
	stepSaveCleanup ckStep = "save: delete the unrecorded generation"
	stepDelRecord   ckStep = "delete: delete the store record"
	stepDelRemove   ckStep = "delete: delete the files"
)

// ckStep runs the test hook of a step (Core.ckFault): an error makes the step fail without
// doing anything.
func (c *Core) ckStep(s ckStep) error {
	if c.ckFault != nil {
		return c.ckFault(s)
	}
	return nil
}

// Defaults of the checkpoint options.
const (
	// DefaultCheckpointCacheBytes is Options.CheckpointCacheBytes when unset.
	DefaultCheckpointCacheBytes int64 = 20 << 30
	// DefaultCheckpointSweepGrace is Options.CheckpointSweepGrace when unset.
	DefaultCheckpointSweepGrace = time.Hour
	// checkpointSweepEvery is how often the janitor sweeps the checkpoint store.
	checkpointSweepEvery = time.Hour
)

// openCheckpoints prepares the checkpoint store at start-up: it opens it, binds download
// links to the core's clock, moves checkpoints of the old folder layout into it, and starts
// sweeping what a crash left in the background (listing a large bucket takes a while, and a
// gateway taking over from another must start serving at once); ckSwept is closed when
// that sweep is done.
func (c *Core) openCheckpoints(ctx context.Context) error {
	f, err := ckfiles.New(ckfiles.Config{
		DataDir: c.opts.DataDir, Store: c.opts.CheckpointStore, CacheBytes: c.opts.CheckpointCacheBytes,
		SweepGrace: c.opts.CheckpointSweepGrace, Log: c.log,
	})
	if err != nil {
		return err
	}
	c.ckpt = f
	c.archives.now = c.now
	if err := f.Migrate(ctx, c.store); err != nil {
		return err
	}
	c.ckSwept = make(chan struct{})
	return c.life.Go("checkpoint store sweep", func(ctx context.Context) {
		defer close(c.ckSwept)
		c.sweepStore(ctx)
	})
}

// sweepStore deletes the checkpoint store's keys that no record references and the step
// snapshots that are no live run's recovery point (ckfiles.Files.Sweep).
func (c *Core) sweepStore(ctx context.Context) {
	c.ckpt.Sweep(ctx, c.now(), c.store, func(key string) bool {
		_, live := c.liveSnapshots.Load(key)
		return live
	})
}

// maybeSweepStore runs sweepStore when the last one is checkpointSweepEvery old.
func (c *Core) maybeSweepStore(ctx context.Context, now time.Time) {
	if now.Sub(c.ckpt.LastSweep()) >= checkpointSweepEvery {
		c.sweepStore(ctx)
	}
}

// CheckpointStore returns the checkpoint store in use.
func (c *Core) CheckpointStore() ckstore.Store { return c.ckpt.Store() }

// PathScheme is the scheme of checkpoint paths: tinker://<run>/weights/<name> for training
// checkpoints, tinker://<run>/sampler_weights/<name> for sampler checkpoints and
// tinker://<run>/external_weights/<name> for exported adapters.
const PathScheme = "tinker://"

// ephemeralTTL is how long an unnamed sampler checkpoint (save_weights_and_get_sampling_client)
// is kept.
const ephemeralTTL = 24 * time.Hour

// MaxCheckpointTTL is the longest expiry (ttl_seconds) a checkpoint can be given: 10 years.
// A checkpoint that should never expire is saved without ttl_seconds (or its TTL set to
// null).
const MaxCheckpointTTL = 10 * 365 * 24 * time.Hour

// checkpointTTL checks a requested ttl_seconds and returns it as a duration: 1 second to
// MaxCheckpointTTL. Saves and SetCheckpointTTL both use it.
func checkpointTTL(seconds int64) (time.Duration, error) {
	limit := int64(MaxCheckpointTTL / time.Second)
	if seconds <= 0 || seconds > limit {
		return 0, invalidArgument("ttl_seconds must be between 1 and %d (10 years), got %d: omit it (or send null) for a checkpoint that never expires", limit, seconds)
	}
	return time.Duration(seconds) * time.Second, nil
}

// ParsePath splits a checkpoint path into run id, kind and name.
func ParsePath(path string) (runID string, kind loopsv1.CheckpointKind, name string, err error) {
	rest, ok := strings.CutPrefix(path, PathScheme)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return "", 0, "", invalidArgument("checkpoint path %q is malformed: it looks like tinker://<run>/weights/<name> or tinker://<run>/sampler_weights/<name>", path)
	}
	kind, ok = ckfiles.KindOf(parts[1])
	if !ok {
		return "", 0, "", invalidArgument("checkpoint path %q has kind %q: use weights, sampler_weights or external_weights", path, parts[1])
	}
	if err := validate.CheckpointName(parts[2]); err != nil {
		return "", 0, "", err
	}
	if strings.ContainsAny(parts[0], `\.`) {
		return "", 0, "", invalidArgument("checkpoint path %q has a malformed run id", path)
	}
	return parts[0], kind, parts[2], nil
}

func checkpointPath(runID string, kind loopsv1.CheckpointKind, name string) string {
	return PathScheme + runID + "/" + ckfiles.KindSegment(kind) + "/" + name
}

// resolveCheckpoint finds a checkpoint the workspace may read (its own, or a public one)
// and opens a local folder with its current generation's files: release the ref when done.
func (c *Core) resolveCheckpoint(ctx context.Context, ws, path string) (*loopsv1.Checkpoint, *ckfiles.Ref, error) {
	ck, owner, err := c.resolveOwned(ctx, ws, path)
	if err != nil {
		return nil, nil, err
	}
	ref, err := c.checkpointFolder(ctx, owner, ck)
	if err != nil {
		return nil, nil, err
	}
	return ck, ref, nil
}

// resolveOwned finds a checkpoint the workspace may read (its own, or a public one) and
// returns it with its owner.
func (c *Core) resolveOwned(ctx context.Context, ws, path string) (*loopsv1.Checkpoint, string, error) {
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, "", err
	}
	runID = c.canonicalRunID(ws, runID)
	ck, owner, err := c.store.GetCheckpointAnyWorkspace(ctx, runID, ckfiles.KindSegment(kind)+"/"+name)
	if err == nil && owner != ws && !ck.GetPublic() {
		err = store.ErrNotFound
	}
	if err != nil {
		return nil, "", storeErr(err, "checkpoint "+path)
	}
	return ck, owner, nil
}

// checkpointFolder opens a local folder with the files of a checkpoint record.
func (c *Core) checkpointFolder(ctx context.Context, owner string, ck *loopsv1.Checkpoint) (*ckfiles.Ref, error) {
	key, err := ckfiles.RecordKey(owner, ck)
	if err != nil {
		return nil, err
	}
	ref, ok, err := c.ckpt.Open(ctx, key)
	if err != nil {
		c.log.Error("opening a checkpoint's files", slog.String("path", ck.GetTinkerPath()), slog.Any("err", err))
		return nil, err
	}
	if !ok {
		return nil, failedPrecondition("checkpoint %s has no complete files in the checkpoint store (it may have been deleted)", ck.GetTinkerPath())
	}
	return ref, nil
}

// saveCheckpoint has the backend write a checkpoint of the run into a staging folder, puts
// it into the checkpoint store as a new generation and commits it by writing the store
// record; an overwrite then deletes the previous generation (see package ckfiles), so a
// crash at any step leaves the old or the new checkpoint whole.
func (c *Core) saveCheckpoint(ctx context.Context, r *run, req *loopsv1.SaveWeightsRequest, seq int64) (func(*loopsv1.Operation), error) {
	kind, name := req.GetKind(), req.GetName()
	ephemeral := kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER && name == ""
	if req.GetInflight() && !ephemeral {
		return nil, invalidArgument("inflight applies to an unnamed sampler save (its sampler follows the run's newest inflight weights); a named or training checkpoint is a fixed snapshot")
	}
	if ephemeral {
		name = fmt.Sprintf("ephemeral-%06d-%s", seq, randHex(4))
	}
	var ttl time.Duration
	switch {
	case req.TtlSeconds != nil:
		d, err := checkpointTTL(req.GetTtlSeconds())
		if err != nil {
			return nil, err
		}
		ttl = d
	case ephemeral:
		ttl = ephemeralTTL
	}
	id := ckfiles.KindSegment(kind) + "/" + name
	prev, err := c.store.GetCheckpoint(ctx, r.Workspace(), r.ID(), id)
	switch {
	case err == nil && !req.GetOverwrite():
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("checkpoint %s already exists: pick another name or pass overwrite=True", checkpointPath(r.ID(), kind, name)))
	case errors.Is(err, store.ErrNotFound):
		prev = nil
	case err != nil:
		return nil, internal("looking up checkpoint", err)
	}
	f := c.ckpt
	gen := f.NextGeneration(c.now(), prev)
	key, err := ckfiles.Key(r.Workspace(), r.ID(), kind, name, gen)
	if err != nil {
		return nil, err
	}
	if err := f.Inside(key); err != nil {
		return nil, err
	}
	m, err := c.putAdapter(ctx, r, key, kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, func(err error) error { return c.adapterLost(r, err) })
	if err != nil {
		return nil, err
	}
	// Until the record points at it, the new generation is invisible; on failure it is
	// deleted here, or by the store sweep after a crash.
	abandon := func(err error) error {
		if c.ckStep(stepSaveCleanup) == nil {
			if derr := f.Store().Delete(context.WithoutCancel(ctx), key); derr != nil {
				c.log.Error("deleting an unrecorded checkpoint generation; the store sweep retries", slog.String("key", key), slog.Any("err", derr))
			}
		}
		return err
	}
	info := r.Record()
	created := time.Unix(0, gen)
	ck := &loopsv1.Checkpoint{
		Id:            id,
		TrainingRunId: r.ID(),
		Kind:          kind,
		Name:          name,
		TinkerPath:    checkpointPath(r.ID(), kind, name),
		SizeBytes:     m.Size(),
		CreateTime:    timestamppb.New(created),
		BaseModel:     info.GetBaseModel(),
		Lora:          info.GetLora(),
		Step:          info.GetOptimSteps(),
	}
	if ttl > 0 {
		ck.ExpireTime = timestamppb.New(created.Add(ttl))
	}
	replaced, err := c.commitCheckpoint(ctx, r.Workspace(), ck)
	if err != nil {
		return nil, abandon(err)
	}
	if replaced != "" {
		c.samplers.retarget(ctx, replaced, key)
		if err := c.ckStep(stepSaveRemove); err == nil {
			if err := f.Store().Delete(context.WithoutCancel(ctx), replaced); err != nil {
				// The record already points at the new generation: the old one is garbage
				// that the store sweep deletes.
				c.log.Error("deleting a replaced checkpoint generation", slog.String("key", replaced), slog.Any("err", err))
			}
		}
	}
	if kind == loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER {
		c.evals.noteSamplerSave(r.Workspace(), r.ID(), ck, info.GetOptimSteps())
	}
	c.updateRun(r, func(i *loopsv1.TrainingRun) {
		switch kind {
		case loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING:
			i.LastCheckpoint = ck
		case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
			i.LastSamplerCheckpoint = ck
			if req.GetInflight() {
				i.InflightSamplerCheckpoint = ck
			}
		}
	})
	res := &loopsv1.SaveWeightsResult{Path: ck.TinkerPath, Checkpoint: ck}
	if ephemeral {
		ref, err := c.adapterOf(ctx, r.Workspace(), ck)
		if err != nil {
			return nil, err
		}
		inflight := ""
		if req.GetInflight() {
			inflight = r.ID()
		}
		s, err := c.samplers.create(ctx, r.Workspace(), info.GetSessionId(), info.GetBaseModel(), ck.TinkerPath, "", inflight, ref)
		if err != nil {
			return nil, err
		}
		res.SamplerId = s.GetId()
	}
	c.recordUsage(r.Workspace(), info.GetBaseModel(), info.GetSessionId(), store.UsageCheckpoint, 1)
	return func(op *loopsv1.Operation) { op.Result = &loopsv1.Operation_SaveWeights{SaveWeights: res} }, nil
}

// putAdapter writes the run's adapter (with its optimizer state if optimizer) into the
// checkpoint store as key: through a staging folder, or straight from a backend that takes
// URLs. A backend error goes through lost (the run's adapterLost, or nothing for a
// snapshot that must not change the run's state).
func (c *Core) putAdapter(ctx context.Context, r *run, key string, optimizer bool, lost func(error) error) (m *ckstore.Manifest, err error) {
	ctx, span := startCheckpointSpan(ctx, key, optimizer)
	defer func() { endSpan(span, err) }()
	if c.ckpt.URLs() != nil {
		return c.saveThroughURLs(ctx, r, key, optimizer, lost)
	}
	return c.saveThroughStaging(ctx, r, key, optimizer, lost)
}

// saveThroughStaging has the backend write the run's adapter into a staging folder on the
// gateway's disk, adds the checkpoint_complete marker and puts the folder into the store as
// key.
func (c *Core) saveThroughStaging(ctx context.Context, r *run, key string, optimizer bool, lost func(error) error) (*ckstore.Manifest, error) {
	f := c.ckpt
	if err := c.ckStep(stepSaveMkdir); err != nil {
		return nil, f.Internal("creating the checkpoint staging folder", err)
	}
	dir, err := os.MkdirTemp(f.Staging(), "save-")
	if err != nil {
		return nil, f.Internal("creating the checkpoint staging folder", err)
	}
	// The staging folder goes whatever happens; a crash leaves it to the start-up, which
	// empties the staging folder.
	defer os.RemoveAll(dir)
	if err := c.ckStep(stepSaveWrite); err != nil {
		return nil, f.Internal("writing checkpoint", err)
	}
	if _, err := c.backend.Trainer().SaveAdapter(ctx, &backendv1.SaveAdapterRequest{
		AdapterId: r.ID(), Dir: dir, IncludeOptimizer: optimizer,
	}); err != nil {
		return nil, f.Scrub(lost(err))
	}
	if err := c.ckStep(stepSaveMarker); err != nil {
		return nil, f.Internal("writing checkpoint marker", err)
	}
	if err := ckfiles.WriteMarker(dir); err != nil {
		return nil, f.Internal("writing checkpoint marker", err)
	}
	if err := c.ckStep(stepSavePut); err != nil {
		return nil, f.Internal("storing checkpoint files", err)
	}
	m, err := f.Store().Put(ctx, key, dir)
	if err != nil {
		return nil, f.Internal("storing checkpoint files", err)
	}
	return m, nil
}

// saveThroughURLs has a backend that takes URLs (ckfiles.Files.UseURLs) upload the run's
// adapter straight into the store as a new generation of key (presigned PUT URLs), adds
// the checkpoint_complete marker and commits the upload with the sizes and SHA-256s the
// backend reports (every later read checks them). Until the commit nothing is visible; an
// upload the commit never came for is removed here or by the store sweep.
func (c *Core) saveThroughURLs(ctx context.Context, r *run, key string, optimizer bool, lost func(error) error) (*ckstore.Manifest, error) {
	f := c.ckpt
	names := []string{peft.AdapterConfigFile, peft.AdapterWeightsFile}
	if optimizer {
		names = append(names, peft.OptimizerFile)
	}
	if err := c.ckStep(stepSaveMkdir); err != nil {
		return nil, f.Internal("starting the checkpoint upload", err)
	}
	up, err := f.URLs().BeginUpload(ctx, key, append(names, ckfiles.CompleteMarker), ckfiles.URLTTL)
	if err != nil {
		return nil, f.Internal("starting the checkpoint upload", err)
	}
	abort := func(err error) error {
		f.URLs().AbortUpload(up)
		return err
	}
	if err := c.ckStep(stepSaveWrite); err != nil {
		return nil, abort(f.Internal("writing checkpoint", err))
	}
	req := &backendv1.SaveAdapterRequest{AdapterId: r.ID(), IncludeOptimizer: optimizer}
	for _, n := range names {
		req.Upload = append(req.Upload, &backendv1.FileURL{Name: n, Url: up.URLs[n]})
	}
	resp, err := c.backend.Trainer().SaveAdapter(ctx, req)
	if err != nil {
		return nil, abort(f.Scrub(lost(err)))
	}
	if err := c.ckStep(stepSaveMarker); err != nil {
		return nil, abort(f.Internal("writing checkpoint marker", err))
	}
	if err := putEmpty(ctx, up.URLs[ckfiles.CompleteMarker]); err != nil {
		return nil, abort(f.Internal("writing checkpoint marker", err))
	}
	files := []ckstore.File{{Name: ckfiles.CompleteMarker, SHA256: emptySHA256}}
	for _, file := range resp.GetFiles() {
		files = append(files, ckstore.File{Name: file.GetName(), Size: file.GetSize(), SHA256: file.GetSha256()})
	}
	if err := c.ckStep(stepSavePut); err != nil {
		return nil, abort(f.Internal("storing checkpoint files", err))
	}
	m, err := f.URLs().CommitUpload(ctx, up, files)
	if err != nil {
		return nil, f.Internal("committing the checkpoint upload", err)
	}
	return m, nil
}

// emptySHA256 is the SHA-256 of no bytes (the checkpoint_complete marker).
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// putEmpty writes an empty object through a presigned PUT URL, within a minute.
func putEmpty(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT of the marker: HTTP %d", resp.StatusCode)
	}
	return nil
}

// adapterOf returns what the backend reads a checkpoint record's files from (see
// ckfiles.Files.Adapter): release it when done.
func (c *Core) adapterOf(ctx context.Context, owner string, ck *loopsv1.Checkpoint) (*ckfiles.Ref, error) {
	key, err := ckfiles.RecordKey(owner, ck)
	if err != nil {
		return nil, err
	}
	if err := c.ckpt.Inside(key); err != nil {
		return nil, err
	}
	ref, ok, err := c.ckpt.Adapter(ctx, key)
	if err != nil {
		c.log.Error("opening a checkpoint's files", slog.String("path", ck.GetTinkerPath()), slog.Any("err", err))
		return nil, err
	}
	if !ok {
		return nil, failedPrecondition("checkpoint %s has no complete files in the checkpoint store (it may have been deleted)", ck.GetTinkerPath())
	}
	return ref, nil
}

// loadAdapter loads a checkpoint record's files into the run's adapter (with its optimizer
// state if optimizer).
func (c *Core) loadAdapter(ctx context.Context, r *run, owner string, ck *loopsv1.Checkpoint, optimizer bool) error {
	ref, err := c.adapterOf(ctx, owner, ck)
	if err != nil {
		return err
	}
	defer ref.Release()
	return c.loadRef(ctx, r, ref, optimizer)
}

// loadKey loads the files stored under key (a step snapshot) into the run's adapter.
func (c *Core) loadKey(ctx context.Context, r *run, key string, optimizer bool) error {
	ref, ok, err := c.ckpt.Adapter(ctx, key)
	if err != nil {
		return err
	}
	if !ok {
		return failedPrecondition("the step snapshot %s is gone from the checkpoint store", key)
	}
	defer ref.Release()
	return c.loadRef(ctx, r, ref, optimizer)
}

// loadRef loads the files a checkpoint ref holds into the run's adapter.
func (c *Core) loadRef(ctx context.Context, r *run, ref *ckfiles.Ref, optimizer bool) error {
	dir, files, err := c.ckpt.Source(ctx, ref)
	if err != nil {
		return err
	}
	_, err = c.backend.Trainer().LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: r.ID(), Dir: dir, Download: files, LoadOptimizer: optimizer})
	return err
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// commitCheckpoint makes the record of a completely stored generation the checkpoint's
// record and returns the store key of the generation it replaced ("" if none).
func (c *Core) commitCheckpoint(ctx context.Context, ws string, ck *loopsv1.Checkpoint) (string, error) {
	f := c.ckpt
	defer f.Lock(ws, ck.GetTrainingRunId(), ck.GetId())()
	if err := c.ckStep(stepSaveRecord); err != nil {
		return "", internal("recording checkpoint", err)
	}
	var replaced string
	if old, err := c.store.GetCheckpoint(ctx, ws, ck.GetTrainingRunId(), ck.GetId()); err == nil {
		if key, err := ckfiles.RecordKey(ws, old); err == nil {
			replaced = key
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", internal("looking up checkpoint", err)
	}
	if err := c.store.PutCheckpoint(ctx, ws, ck); err != nil {
		return "", internal("recording checkpoint", err)
	}
	return replaced, nil
}

// expireCheckpoints deletes checkpoints whose TTL has passed.
func (c *Core) expireCheckpoints(ctx context.Context, now time.Time) {
	expired, err := c.store.ListExpiredCheckpoints(ctx, now)
	if err != nil {
		c.log.Error("listing expired checkpoints", slog.Any("err", err))
		return
	}
	for _, e := range expired {
		err := c.deleteCheckpoint(ctx, e.Workspace, e.Checkpoint.GetTrainingRunId(), e.Checkpoint.GetId(), e.Checkpoint)
		if isPinned(err) {
			continue // deployed: it expires once no deployment holds it
		}
		if err != nil {
			c.log.Error("deleting expired checkpoint", slog.String("path", e.Checkpoint.GetTinkerPath()), slog.Any("err", err))
		}
	}
}

// deleteCheckpoint deletes a checkpoint: its record first (the commit point), then its
// generation's key in the checkpoint store. If the record delete fails, nothing changed and
// the delete can be retried; if deleting the key fails, the checkpoint is gone and the store
// sweep deletes the files. With want set, the checkpoint is deleted only if its record is
// still exactly want (the janitor's expiry does not delete a checkpoint overwritten or given
// a new TTL meanwhile). A checkpoint that a deployment holds is not deleted: the error
// names the deployments (pinnedBy).
func (c *Core) deleteCheckpoint(ctx context.Context, ws, runID, id string, want *loopsv1.Checkpoint) error {
	f := c.ckpt
	key, err := func() (string, error) {
		defer f.Lock(ws, runID, id)()
		ck, err := c.store.GetCheckpoint(ctx, ws, runID, id)
		if err != nil {
			return "", err
		}
		if want != nil && !proto.Equal(ck, want) {
			return "", nil
		}
		if err := c.pinnedBy(ctx, ws, runID, id, ck.GetTinkerPath()); err != nil {
			return "", err
		}
		key, kerr := ckfiles.RecordKey(ws, ck)
		err = c.ckStep(stepDelRecord)
		if err == nil {
			err = c.store.DeleteCheckpoint(ctx, ws, runID, id)
		}
		if err != nil {
			return "", internal("deleting the checkpoint record (nothing was deleted; retry)", err)
		}
		if err := c.store.DeleteEvalResults(ctx, ws, runID, id); err != nil {
			c.log.Error("deleting a deleted checkpoint's eval results", slog.String("checkpoint", ck.GetTinkerPath()), slog.Any("err", err))
		}
		if kerr != nil {
			return "", nil // a record no key can belong to: nothing to delete
		}
		return key, nil
	}()
	if err != nil || key == "" {
		return err
	}
	if err := c.ckStep(stepDelRemove); err == nil {
		if err := f.Store().Delete(context.WithoutCancel(ctx), key); err != nil {
			c.log.Error("deleting a deleted checkpoint's files; the store sweep retries", slog.String("key", key), slog.Any("err", err))
		}
	}
	return nil
}

// CheckpointService implements loops.v1 CheckpointService.
type CheckpointService struct{ c *Core }

// ListCheckpoints lists checkpoints of one run or of the workspace.
func (s CheckpointService) ListCheckpoints(ctx context.Context, req *loopsv1.ListCheckpointsRequest) (*loopsv1.ListCheckpointsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	runID := s.c.canonicalRunID(ws, req.GetTrainingRunId())
	list := "checkpoints"
	if runID != "" {
		list += " of training run " + quote(runID)
	}
	page, err := s.c.pageOf(ws, list, req.GetLimit(), req.GetOffset(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if runID != "" {
		if _, err := s.c.store.GetTrainingRun(ctx, ws, runID); err != nil {
			return nil, storeErr(err, "training run "+quote(runID))
		}
	}
	cks, total, err := s.c.store.ListCheckpoints(ctx, ws, runID, page.Page)
	if err != nil {
		return nil, internal("listing checkpoints", err)
	}
	cks, next := nextPage(page, cks)
	return &loopsv1.ListCheckpointsResponse{Checkpoints: cks, TotalCount: total, NextPageToken: next}, nil
}

// GetCheckpoint returns a checkpoint the caller may read.
func (s CheckpointService) GetCheckpoint(ctx context.Context, req *loopsv1.GetCheckpointRequest) (*loopsv1.Checkpoint, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, _, err := s.c.resolveOwned(ctx, ws, req.GetPath())
	return ck, err
}

// owned returns a checkpoint that the workspace owns (public ones of others are read-only).
func (s CheckpointService) owned(ctx context.Context, ws, path string) (*loopsv1.Checkpoint, error) {
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, err
	}
	ck, err := s.c.store.GetCheckpoint(ctx, ws, s.c.canonicalRunID(ws, runID), ckfiles.KindSegment(kind)+"/"+name)
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
	runID, kind, name, err := ParsePath(req.GetPath())
	if err != nil {
		return nil, err
	}
	err = s.c.deleteCheckpoint(ctx, ws, s.c.canonicalRunID(ws, runID), ckfiles.KindSegment(kind)+"/"+name, nil)
	if errors.Is(err, store.ErrNotFound) {
		return nil, storeErr(err, "checkpoint "+req.GetPath())
	}
	if err != nil {
		if connect.CodeOf(err) == connect.CodeUnknown {
			err = internal("deleting checkpoint", err)
		}
		return nil, s.c.ckpt.Scrub(err)
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
		ttl, err := checkpointTTL(req.GetTtlSeconds())
		if err != nil {
			return err
		}
		ck.ExpireTime = timestamppb.New(s.c.now().Add(ttl))
		return nil
	})
}

func (s CheckpointService) modify(ctx context.Context, path string, f func(*loopsv1.Checkpoint) error) (*loopsv1.Checkpoint, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, err
	}
	runID = s.c.canonicalRunID(ws, runID)
	// Under the checkpoint's lock: a save committing meanwhile must not be undone by
	// writing back the record it replaced.
	defer s.c.ckpt.Lock(ws, runID, ckfiles.KindSegment(kind)+"/"+name)()
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

// retarget points the live samplers that sample from the checkpoint generation oldKey at
// newKey (an overwritten checkpoint's new generation), as they followed the checkpoint's
// name before generations existed. The new folder is opened outside the samplers' locks.
func (ss *samplers) retarget(ctx context.Context, oldKey, newKey string) {
	ss.mu.Lock()
	var follow []*samplerState
	for _, st := range ss.byID {
		st.mu.Lock()
		if st.ref != nil && st.ref.Key() == oldKey {
			follow = append(follow, st)
		}
		st.mu.Unlock()
	}
	ss.mu.Unlock()
	if len(follow) == 0 {
		return
	}
	ref, ok, err := ss.c.ckpt.Adapter(ctx, newKey)
	if err != nil || !ok {
		ss.c.log.Error("opening an overwritten checkpoint for its samplers", slog.String("key", newKey), slog.Any("err", err))
		return
	}
	defer ref.Release()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, st := range follow {
		if ss.byID[st.info.GetId()] != st {
			continue // dropped meanwhile: it released its folder
		}
		st.mu.Lock()
		old := st.ref
		if old != nil && old.Key() == oldKey {
			st.ref = ref.Hold()
			old.Release()
		}
		st.mu.Unlock()
	}
}
