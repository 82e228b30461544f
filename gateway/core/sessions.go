package core

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/lockorder"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// sessionState is a live session: its record and the client counters used to de-duplicate
// retried creations.
type sessionState struct {
	ws   string
	mu   lockorder.Mutex[rankSession]
	info *loopsv1.Session
	// samplersReserved counts samplers being created (reserveSampler), so the cap holds
	// while their records are written.
	samplersReserved int
	lastBeat         time.Time
	runSeq           *onceTable // client_seq_id -> create operation id
	samplerSeq       *onceTable // client_seq_id -> sampler id
	dirty            bool
}

// reserveSampler takes room for one more sampler in the session, refusing past
// Limits.MaxSamplersPerSession; the room is counted until addSampler uses it or
// unreserveSampler gives it back, so concurrent creations cannot pass the cap.
func (s *sessionState) reserveSampler(c *Core) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if limit := c.opts.Limits.MaxSamplersPerSession; len(s.info.GetSamplerIds())+s.samplersReserved >= limit {
		return c.limitReached(errs.ReasonLimitReached, "max_samplers_per_session",
			"session %s has created %d samplers, the limit per session (max_samplers_per_session): create a new session (service client) for more", s.info.GetId(), limit)
	}
	s.samplersReserved++
	return nil
}

// unreserveSampler gives back room taken by reserveSampler for a sampler not created.
func (s *sessionState) unreserveSampler() {
	s.mu.Lock()
	s.samplersReserved--
	s.mu.Unlock()
}

// addRun records a run in the session. It fails once the session has ended, so a run
// created while its session ends is either in the list endSession unloads or refused, and
// past Limits.MaxRunsPerSession.
func (s *sessionState) addRun(c *Core, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.info.GetExpired() {
		return failedPrecondition("session %s has ended (%s): create a new client", s.info.GetId(), s.info.GetEndReason())
	}
	if limit := c.opts.Limits.MaxRunsPerSession; len(s.info.GetTrainingRunIds()) >= limit {
		return c.limitReached(errs.ReasonLimitReached, "max_runs_per_session",
			"session %s has created %d training runs, the limit per session (max_runs_per_session): create a new session (service client) for more", s.info.GetId(), limit)
	}
	s.info = proto.CloneOf(s.info)
	s.info.TrainingRunIds = append(s.info.TrainingRunIds, id)
	s.dirty = true
	return nil
}

// removeRun takes back a run addRun recorded whose creation then failed.
func (s *sessionState) removeRun(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.info = proto.CloneOf(s.info)
	s.info.TrainingRunIds = slices.DeleteFunc(s.info.TrainingRunIds, func(x string) bool { return x == id })
	s.dirty = true
}

// addSampler records a sampler created with room from reserveSampler.
func (s *sessionState) addSampler(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samplersReserved--
	s.info = proto.CloneOf(s.info)
	s.info.SamplerIds = append(s.info.SamplerIds, id)
	s.dirty = true
}

func (s *sessionState) snapshot() *loopsv1.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

// session returns a live session of the workspace; an expired one is a FailedPrecondition.
// A live session that is not in memory (the server restarted) is revived from the store.
func (c *Core) session(ctx context.Context, ws, id string) (*sessionState, error) {
	c.mu.Lock()
	s, ok := c.sessions[id]
	c.mu.Unlock()
	if !ok || s.ws != ws {
		stored, err := c.store.GetSession(ctx, ws, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, notFound("session %q not found (it does not exist, or belongs to another API key's workspace)", id)
		case err != nil:
			return nil, internal("reading a session", err)
		case stored.GetExpired():
			why := cmp.Or(stored.GetEndReason(), "it finished, or had no heartbeat for "+c.opts.SessionTTL.String())
			return nil, failedPrecondition("session %s has ended (%s): create a new client", id, why)
		}
		s = c.reviveSession(ws, stored)
	}
	if s.snapshot().GetExpired() {
		return nil, failedPrecondition("session %s has ended (%s): create a new client", id, s.snapshot().GetEndReason())
	}
	return s, nil
}

// reviveSession brings back a live session recorded in the store that is not in memory:
// the server restarted while its client was running. Its heartbeat clock starts now; its
// runs were recovered at start-up (their adapters are recreated on first use, see
// ensureAdapter). Retries of creations from before the restart are not de-duplicated.
func (c *Core) reviveSession(ws string, info *loopsv1.Session) *sessionState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.sessions[info.GetId()]; ok { // revived meanwhile by another request
		return s
	}
	s := &sessionState{ws: ws, info: info, lastBeat: c.now(), runSeq: newOnceTable(), samplerSeq: newOnceTable()}
	c.sessions[info.GetId()] = s
	c.liveSessions[ws]++
	c.log.Info("session revived after a restart", slog.String("session", info.GetId()))
	return s
}

// persistSession writes a session's record if it changed.
func (c *Core) persistSession(ctx context.Context, s *sessionState) {
	s.mu.Lock()
	if !s.dirty {
		s.mu.Unlock()
		return
	}
	s.dirty = false
	info := s.info
	s.mu.Unlock()
	if err := c.store.PutSession(ctx, s.ws, info); err != nil {
		c.log.Error("persisting session", slog.String("session", info.GetId()), slog.Any("err", err))
	}
}

// expireSessions ends sessions whose client stopped sending heartbeats.
func (c *Core) expireSessions(ctx context.Context, now time.Time) {
	c.mu.Lock()
	var expired []*sessionState
	for _, s := range c.sessions {
		s.mu.Lock()
		if now.Sub(s.lastBeat) > c.opts.SessionTTL {
			expired = append(expired, s)
		}
		s.mu.Unlock()
	}
	c.mu.Unlock()
	for _, s := range expired {
		c.endSession(ctx, s, "heartbeat timeout", "no heartbeat for "+c.opts.SessionTTL.String())
	}
	c.persistSessions(ctx)
}

// persistSessions writes every live session's record that changed.
func (c *Core) persistSessions(ctx context.Context) {
	c.mu.Lock()
	all := slices.Collect(maps.Values(c.sessions))
	c.mu.Unlock()
	for _, s := range all {
		c.persistSession(ctx, s)
	}
}

// endSession ends a session: its runs' adapters are unloaded (checkpoints stay) and its
// samplers are dropped. why is recorded; detail goes into later errors.
func (c *Core) endSession(ctx context.Context, s *sessionState, why, detail string) *loopsv1.Session {
	s.mu.Lock()
	if s.info.GetExpired() { // another call is ending it
		info := s.info
		s.mu.Unlock()
		return info
	}
	s.info = proto.CloneOf(s.info)
	s.info.Expired = true
	s.info.EndReason = why
	s.dirty = true
	info := s.info
	s.mu.Unlock()
	// The session leaves memory only once the store records it ended, so a request that
	// misses it in memory never revives it (reviveSession) from a stale record.
	c.persistSession(ctx, s)
	c.mu.Lock()
	if c.sessions[info.GetId()] == s {
		delete(c.sessions, info.GetId())
		c.forgetSessionLocked(s.ws)
	}
	c.mu.Unlock()
	c.log.Info("session ended", slog.String("session", info.GetId()), slog.String("reason", why))
	for _, id := range info.GetTrainingRunIds() {
		if r, err := c.runOf(s.ws, id); err == nil {
			c.unloadRun(ctx, r, "its session "+info.GetId()+" ended ("+detail+"); load its last checkpoint into a new run to continue", false)
		}
	}
	c.samplers.dropSession(info.GetId())
	return info
}

// reserveSession takes room for one more live session of the workspace, refusing past
// Limits.MaxSessionsPerWorkspace. The room counts (c.liveSessions) from now on, so
// concurrent creations cannot pass the cap while their records are written; the session
// that uses it is added with addSession, or the room is given back with
// forgetSessionLocked.
func (c *Core) reserveSession(ws string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if limit := c.opts.Limits.MaxSessionsPerWorkspace; c.liveSessions[ws] >= limit {
		return c.limitReached(errs.ReasonLimitReached, "max_sessions_per_workspace",
			"this workspace has %d live sessions, the limit (max_sessions_per_workspace): finish sessions you no longer use (they also end %s after their last heartbeat)", limit, c.opts.SessionTTL)
	}
	c.liveSessions[ws]++
	return nil
}

// forgetSessionLocked gives back a live session's room (it ended, or its creation failed);
// c.mu must be held.
func (c *Core) forgetSessionLocked(ws string) {
	if c.liveSessions[ws]--; c.liveSessions[ws] <= 0 {
		delete(c.liveSessions, ws)
	}
}

// SessionService implements loops.v1 SessionService.
type SessionService struct{ c *Core }

// CreateSession starts a session.
func (s SessionService) CreateSession(ctx context.Context, req *loopsv1.CreateSessionRequest) (*loopsv1.Session, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.GetTags()) > 100 || len(req.GetUserMetadata()) > 100 {
		return nil, invalidArgument("at most 100 tags and 100 user_metadata entries")
	}
	if len(req.GetDisplayName()) > maxDisplayNameBytes {
		return nil, invalidArgument("display_name is %d bytes, over the maximum of %d", len(req.GetDisplayName()), maxDisplayNameBytes)
	}
	project, err := s.c.projectForUse(ctx, ws, req.GetProjectId())
	if err != nil {
		return nil, err
	}
	if err := s.c.reserveSession(ws); err != nil {
		return nil, err
	}
	// Microseconds: a search cursor that went through a Python datetime comes back exact.
	now := s.c.now().Truncate(time.Microsecond)
	info := &loopsv1.Session{
		Id:                newID("sess"),
		Tags:              slices.Compact(slices.Sorted(slices.Values(req.GetTags()))),
		UserMetadata:      req.GetUserMetadata(),
		SdkVersion:        req.GetSdkVersion(),
		ProjectId:         project.GetName(),
		DisplayName:       req.GetDisplayName(),
		Owner:             auth.CallerOf(ctx).KeyID,
		CreateTime:        timestamppb.New(now),
		LastHeartbeatTime: timestamppb.New(now),
	}
	if err := s.c.store.PutSession(ctx, ws, info); err != nil {
		s.c.mu.Lock()
		s.c.forgetSessionLocked(ws)
		s.c.mu.Unlock()
		return nil, internal("recording session", err)
	}
	st := &sessionState{ws: ws, info: info, lastBeat: now, runSeq: newOnceTable(), samplerSeq: newOnceTable()}
	s.c.mu.Lock()
	s.c.sessions[info.Id] = st // its room was reserved
	s.c.mu.Unlock()
	return info, nil
}

// HeartbeatSession keeps a session alive.
func (s SessionService) HeartbeatSession(ctx context.Context, req *loopsv1.HeartbeatSessionRequest) (*loopsv1.HeartbeatSessionResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.c.session(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	now := s.c.now()
	st.mu.Lock()
	st.lastBeat = now
	st.info = proto.CloneOf(st.info)
	st.info.LastHeartbeatTime = timestamppb.New(now)
	st.dirty = true
	st.mu.Unlock()
	return &loopsv1.HeartbeatSessionResponse{}, nil
}

// FinishSession ends a session at the client's request.
func (s SessionService) FinishSession(ctx context.Context, req *loopsv1.FinishSessionRequest) (*loopsv1.Session, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.c.session(ctx, ws, req.GetId())
	if connect.CodeOf(err) == connect.CodeFailedPrecondition {
		// Already ended: finishing again is a no-op.
		return s.c.store.GetSession(ctx, ws, req.GetId())
	}
	if err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "unspecified"
	}
	return s.c.endSession(ctx, st, "finished: "+reason, "the client finished it"), nil
}

// GetSession returns a session.
func (s SessionService) GetSession(ctx context.Context, req *loopsv1.GetSessionRequest) (*loopsv1.Session, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	s.c.mu.Lock()
	st, ok := s.c.sessions[req.GetId()]
	s.c.mu.Unlock()
	if ok && st.ws == ws {
		return st.snapshot(), nil
	}
	info, err := s.c.store.GetSession(ctx, ws, req.GetId())
	if err != nil {
		return nil, storeErr(err, "session "+quote(req.GetId()))
	}
	return info, nil
}

// ListSessions lists the workspace's sessions, newest first.
func (s SessionService) ListSessions(ctx context.Context, req *loopsv1.ListSessionsRequest) (*loopsv1.ListSessionsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	page, err := s.c.pageOf(ws, "sessions", req.GetLimit(), req.GetOffset(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	list, total, err := s.c.store.ListSessions(ctx, ws, page.Page)
	if err != nil {
		return nil, internal("listing sessions", err)
	}
	list, next := nextPage(page, list)
	return &loopsv1.ListSessionsResponse{Sessions: list, TotalCount: total, NextPageToken: next}, nil
}
