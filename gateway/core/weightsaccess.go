package core

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Weights-access tokens let another workspace copy one checkpoint (CopyWeights, Tinker's
// copy_weights): the owner issues one for a checkpoint, hands its secret over, and revokes
// it or lets it expire. Only the secret's SHA-256 is stored; the secret is 32 random bytes,
// so a fast hash is enough (nothing to brute-force).

// Limits of weights-access tokens.
const (
	// MaxWeightsAccessTokens bounds the live (unexpired) tokens of one workspace.
	MaxWeightsAccessTokens = 100
	// DefaultWeightsAccessTTL is a token's life when the request gives none.
	DefaultWeightsAccessTTL = 7 * 24 * time.Hour
	// minWeightsAccessTTL and maxWeightsAccessTTL bound a requested ttl_seconds.
	minWeightsAccessTTL = time.Minute
	maxWeightsAccessTTL = 365 * 24 * time.Hour
	// maxTokenDescription bounds a token's description, in bytes.
	maxTokenDescription = 256
	// maxIdempotencyKey and maxProjectID bound CopyWeights' strings, in bytes.
	maxIdempotencyKey = 128
	maxProjectID      = 128
	// weightsAccessPrefix starts every token's secret; 64 hex digits follow.
	weightsAccessPrefix = "lwat_"
	// copyTimeout bounds one copy's reading and writing of the files.
	copyTimeout = 10 * time.Minute
)

// errBadAccessToken is the one answer to a token that is malformed, unknown, revoked or
// expired: which of these it is stays unsaid, so a guess learns nothing.
var errBadAccessToken = connect.NewError(connect.CodePermissionDenied,
	errors.New("the weights access token is not valid: it is unknown, revoked or expired (ask the checkpoint's owner for a new one)"))

// hashAccessToken is what the store keeps of a token's secret: its SHA-256, in hex.
func hashAccessToken(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// newAccessToken returns a fresh secret.
func newAccessToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails on supported platforms
	return weightsAccessPrefix + hex.EncodeToString(b)
}

// wellFormedAccessToken reports whether secret has the shape of a token (it may still be
// unknown): the prefix and 64 lower-case hex digits.
func wellFormedAccessToken(secret string) bool {
	hexPart, ok := strings.CutPrefix(secret, weightsAccessPrefix)
	if !ok || len(hexPart) != 64 {
		return false
	}
	for _, r := range hexPart {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// accessTokenTTL checks a requested ttl_seconds (nil: the default).
func accessTokenTTL(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return DefaultWeightsAccessTTL, nil
	}
	lo, hi := int64(minWeightsAccessTTL/time.Second), int64(maxWeightsAccessTTL/time.Second)
	if *seconds < lo || *seconds > hi {
		return 0, invalidArgument("ttl_seconds must be between %d (a minute) and %d (a year), got %d: omit it for %s", lo, hi, *seconds, DefaultWeightsAccessTTL)
	}
	return time.Duration(*seconds) * time.Second, nil
}

// checkText checks a free-text field: valid UTF-8 without control characters, at most max
// bytes.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return invalidArgument("%s is %d bytes: the limit is %d", field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return invalidArgument("%s is not valid UTF-8", field)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return invalidArgument("%s has a control character at byte %d", field, i)
	}
	return nil
}

// WeightsAccessService implements loops.v1 WeightsAccessService.
type WeightsAccessService struct{ c *Core }

// CreateWeightsAccessToken issues a token for one of the workspace's checkpoints.
func (s WeightsAccessService) CreateWeightsAccessToken(ctx context.Context, req *loopsv1.CreateWeightsAccessTokenRequest) (*loopsv1.CreateWeightsAccessTokenResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ttl, err := accessTokenTTL(req.TtlSeconds)
	if err != nil {
		return nil, err
	}
	if err := checkText("description", req.GetDescription(), maxTokenDescription); err != nil {
		return nil, err
	}
	if req.GetCheckpointPath() == "" {
		return nil, invalidArgument("checkpoint_path is required: the tinker://<run>/<kind>/<name> checkpoint to share")
	}
	ck, err := CheckpointService(s).owned(ctx, ws, req.GetCheckpointPath())
	if err != nil {
		return nil, err
	}
	now := s.c.now()
	t := &loopsv1.WeightsAccessToken{
		Id:             "wat-" + randHex(8),
		CheckpointPath: ck.GetTinkerPath(),
		CreateTime:     timestamppb.New(now),
		ExpireTime:     timestamppb.New(now.Add(ttl)),
		Description:    req.GetDescription(),
		CreatedBy:      auth.CallerOf(ctx).KeyID,
	}
	secret := newAccessToken()
	err = s.c.store.CreateWeightsAccessToken(ctx, ws, t, hashAccessToken(secret), now, MaxWeightsAccessTokens)
	if errors.Is(err, store.ErrLimit) {
		return nil, resourceExhausted("workspace %q holds %d live weights access tokens, the most it may: revoke one (loops weights-access revoke <id>) or wait for one to expire", ws, MaxWeightsAccessTokens)
	}
	if err != nil {
		return nil, internal("recording the weights access token", err)
	}
	s.c.log.Info("weights access token issued", slog.String("workspace", ws), slog.String("id", t.GetId()),
		slog.String("path", t.GetCheckpointPath()), slog.String("key", t.GetCreatedBy()), slog.Time("expires", now.Add(ttl)))
	return &loopsv1.CreateWeightsAccessTokenResponse{Token: secret, WeightsAccessToken: t}, nil
}

// ListWeightsAccessTokens lists the workspace's live tokens, newest first.
func (s WeightsAccessService) ListWeightsAccessTokens(ctx context.Context, _ *loopsv1.ListWeightsAccessTokensRequest) (*loopsv1.ListWeightsAccessTokensResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := s.c.store.ListWeightsAccessTokens(ctx, ws, s.c.now())
	if err != nil {
		return nil, internal("listing weights access tokens", err)
	}
	return &loopsv1.ListWeightsAccessTokensResponse{WeightsAccessTokens: ts}, nil
}

// RevokeWeightsAccessToken deletes one of the workspace's tokens.
func (s WeightsAccessService) RevokeWeightsAccessToken(ctx context.Context, req *loopsv1.RevokeWeightsAccessTokenRequest) (*loopsv1.RevokeWeightsAccessTokenResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, invalidArgument("id is required: the token's id (wat-…), as ListWeightsAccessTokens shows it")
	}
	if err := s.c.store.DeleteWeightsAccessToken(ctx, ws, req.GetId()); err != nil {
		return nil, storeErr(err, "weights access token "+quote(clip(req.GetId())))
	}
	s.c.log.Info("weights access token revoked", slog.String("workspace", ws), slog.String("id", req.GetId()),
		slog.String("key", auth.CallerOf(ctx).KeyID))
	return &loopsv1.RevokeWeightsAccessTokenResponse{}, nil
}

// CopyWeights copies a checkpoint into a new run of the calling workspace.
func (s WeightsAccessService) CopyWeights(ctx context.Context, req *loopsv1.CopyWeightsRequest) (*loopsv1.CopyWeightsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	ck, err := s.c.copyWeights(ctx, ws, req)
	if err != nil {
		return nil, err
	}
	return &loopsv1.CopyWeightsResponse{TinkerPath: ck.GetTinkerPath(), Checkpoint: ck}, nil
}

// readableWith finds the checkpoint at path that the workspace may read: its own, a public
// one, or the one a valid weights-access token (secret, may be empty) was issued for. It
// returns the record and its owner.
func (c *Core) readableWith(ctx context.Context, ws, path, secret string) (*loopsv1.Checkpoint, string, error) {
	runID, kind, name, err := ParsePath(path)
	if err != nil {
		return nil, "", err
	}
	if secret == "" {
		return c.resolveOwned(ctx, ws, path)
	}
	if !wellFormedAccessToken(secret) {
		return nil, "", errBadAccessToken
	}
	t, owner, err := c.store.GetWeightsAccessToken(ctx, hashAccessToken(secret))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, "", errBadAccessToken
	case err != nil:
		return nil, "", internal("looking up the weights access token", err)
	case !c.now().Before(t.GetExpireTime().AsTime()):
		return nil, "", errBadAccessToken
	}
	id := ckfiles.KindSegment(kind) + "/" + name
	if checkpointPath(c.canonicalRunID(owner, runID), kind, name) != t.GetCheckpointPath() {
		// The token is for another checkpoint: it grants nothing here.
		return c.resolveOwned(ctx, ws, path)
	}
	ck, err := c.store.GetCheckpoint(ctx, owner, c.canonicalRunID(owner, runID), id)
	if err != nil {
		return nil, "", storeErr(err, "checkpoint "+path)
	}
	return ck, owner, nil
}

// copyRunID is the id of the run that holds a copy: derived from the workspace and the
// idempotency key when there is one (a retry finds the first copy), else fresh.
func copyRunID(ws, idempotencyKey string) string {
	if idempotencyKey == "" {
		return newID("run")
	}
	sum := sha256.Sum256([]byte("copy_weights\x00" + ws + "\x00" + idempotencyKey))
	return "run-" + hex.EncodeToString(sum[:10])
}

// copiedFromKey is the user_metadata key of a copy's run that names the checkpoint copied.
const copiedFromKey = "loops.copied_from"

// earlierCopy returns the copy of src that an earlier CopyWeights with the same idempotency
// key made in run runID, or nil when there is none (or the run was recorded and its copy
// not, by a process that died between: the caller copies again).
func (c *Core) earlierCopy(ctx context.Context, ws, runID string, src *loopsv1.Checkpoint) (*loopsv1.Checkpoint, error) {
	prev, err := c.store.GetTrainingRun(ctx, ws, runID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, internal("looking up an earlier copy", err)
	}
	if from := prev.GetUserMetadata()[copiedFromKey]; from != src.GetTinkerPath() {
		return nil, invalidArgument("the idempotency key was used for a copy of %s: use a new key for another copy", from)
	}
	done, err := c.store.GetCheckpoint(ctx, ws, runID, src.GetId())
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, internal("looking up an earlier copy", err)
	}
	return done, nil
}

// copyWeights copies a checkpoint the workspace may read (readableWith) into a new run of
// the workspace, unloaded (its reason says it holds a copy): the files are put into the
// checkpoint store under the workspace's own key (the local store hard-links them when it
// can: same bytes, independent files), so deleting the source later leaves the copy whole.
// With an idempotency key, a retry answers the first copy.
func (c *Core) copyWeights(ctx context.Context, ws string, req *loopsv1.CopyWeightsRequest) (*loopsv1.Checkpoint, error) {
	if req.GetSourcePath() == "" {
		return nil, invalidArgument("source_path is required: the tinker://<run>/<kind>/<name> checkpoint to copy")
	}
	if err := checkText("destination_project_id", req.GetDestinationProjectId(), maxProjectID); err != nil {
		return nil, err
	}
	if err := checkText("idempotency key", req.GetIdempotencyKey(), maxIdempotencyKey); err != nil {
		return nil, err
	}
	var ttl time.Duration
	if req.TtlSeconds != nil {
		d, err := checkpointTTL(req.GetTtlSeconds())
		if err != nil {
			return nil, err
		}
		ttl = d
	}
	src, owner, err := c.readableWith(ctx, ws, req.GetSourcePath(), req.GetWeightsAccessToken())
	if err != nil {
		return nil, err
	}
	runID := copyRunID(ws, req.GetIdempotencyKey())
	if req.GetIdempotencyKey() != "" {
		done, err := c.earlierCopy(ctx, ws, runID, src)
		if done != nil || err != nil {
			return done, err
		}
	}
	if _, err := c.model(src.GetBaseModel()); err != nil {
		return nil, failedPrecondition("checkpoint %s is of base model %q, which this server does not serve: its copy could not be used", src.GetTinkerPath(), src.GetBaseModel())
	}
	if err := c.policy.AllowModel(ws, src.GetBaseModel()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, copyTimeout)
	defer cancel()
	ref, err := c.checkpointFolder(ctx, owner, src)
	if err != nil {
		return nil, err
	}
	defer ref.Release()

	f := c.ckpt
	now := c.now()
	kind, name := src.GetKind(), src.GetName()
	run := &loopsv1.TrainingRun{
		Id: runID, BaseModel: src.GetBaseModel(), Lora: src.GetLora(),
		CreateTime: timestamppb.New(now), LastRequestTime: timestamppb.New(now),
		UserMetadata: map[string]string{copiedFromKey: src.GetTinkerPath()},
		UnloadReason: "a copy of " + src.GetTinkerPath() + " (copy_weights): it holds a checkpoint only; create a training run from it to train it",
	}
	gen := f.NextGeneration(now, nil)
	key, err := ckfiles.Key(ws, runID, kind, name, gen)
	if err != nil {
		return nil, err
	}
	if err := f.Inside(key); err != nil {
		return nil, err
	}
	if err := c.store.PutTrainingRun(ctx, ws, run); err != nil {
		return nil, internal("recording the copy's run", err)
	}
	m, err := f.Store().Put(ctx, key, ref.Dir())
	if err != nil {
		return nil, f.Internal("storing the copied checkpoint files", err)
	}
	created := time.Unix(0, gen)
	ck := &loopsv1.Checkpoint{
		Id: ckfiles.KindSegment(kind) + "/" + name, TrainingRunId: runID, Kind: kind, Name: name,
		TinkerPath: checkpointPath(runID, kind, name), SizeBytes: m.Size(), CreateTime: timestamppb.New(created),
		BaseModel: src.GetBaseModel(), Lora: src.GetLora(),
		ProjectId: req.GetDestinationProjectId(), CopiedFrom: src.GetTinkerPath(),
	}
	if ttl > 0 {
		ck.ExpireTime = timestamppb.New(created.Add(ttl))
	}
	replaced, err := c.commitCheckpoint(ctx, ws, ck)
	if err != nil {
		if derr := f.Store().Delete(context.WithoutCancel(ctx), key); derr != nil {
			c.log.Error("deleting an unrecorded copy; the store sweep retries", slog.String("key", key), slog.Any("err", derr))
		}
		return nil, err
	}
	if replaced != "" && replaced != key {
		// A concurrent retry with the same idempotency key committed first: its files go.
		if err := f.Store().Delete(context.WithoutCancel(ctx), replaced); err != nil {
			c.log.Error("deleting a replaced copy", slog.String("key", replaced), slog.Any("err", err))
		}
	}
	switch kind {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		run.LastSamplerCheckpoint = ck
	default:
		run.LastCheckpoint = ck
	}
	if err := c.store.PutTrainingRun(ctx, ws, run); err != nil {
		c.log.Error("recording a copy's checkpoint on its run", slog.Any("err", err))
	}
	c.recordUsage(ws, src.GetBaseModel(), "", store.UsageCheckpoint, 1)
	c.log.Info("checkpoint copied", slog.String("workspace", ws), slog.String("from", src.GetTinkerPath()),
		slog.String("owner", owner), slog.String("path", ck.GetTinkerPath()), slog.String("project", ck.GetProjectId()),
		slog.Bool("with_token", req.GetWeightsAccessToken() != ""), slog.String("key", auth.CallerOf(ctx).KeyID))
	return ck, nil
}

// expireWeightsAccessTokens deletes the tokens that have expired.
func (c *Core) expireWeightsAccessTokens(ctx context.Context, now time.Time) {
	n, err := c.store.DeleteExpiredWeightsAccessTokens(ctx, now)
	if err != nil {
		c.log.Error("deleting expired weights access tokens", slog.Any("err", err))
		return
	}
	if n > 0 {
		c.log.Debug("deleted expired weights access tokens", slog.Int("count", n))
	}
}
