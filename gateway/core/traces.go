package core

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/optrace"
)

// Bounds of a session's trace.
const (
	// MaxTraceOperations caps the operations one trace draws (the newest of each run and
	// sampler, in turn, until the budget is spent).
	MaxTraceOperations = 10000
	// maxTraceSamplers caps the samplers of a session a trace draws.
	maxTraceSamplers = 1000
	// TraceURLTTL is how long a trace link lives.
	TraceURLTTL = time.Hour
	// MaxTraceLinks and MaxTraceLinksPerWorkspace cap the unexpired trace links.
	MaxTraceLinks             = 10000
	MaxTraceLinksPerWorkspace = 100
)

// TracePathPrefix is where trace links are served (gateway): TracePathPrefix + token +
// ".json". The token is the only credential, so the path needs no API key.
const TracePathPrefix = "/v1/session_traces/"

// TraceService implements loops.v1 TraceService.
type TraceService struct{ c *Core }

// ExportSessionTrace returns the trace of a session of the caller's workspace.
func (s TraceService) ExportSessionTrace(ctx context.Context, req *loopsv1.ExportSessionTraceRequest) (*loopsv1.SessionTrace, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	return s.c.sessionTrace(ctx, ws, req.GetSessionId())
}

// GetSessionTraceURL returns a short-lived link to a session's trace, built when fetched.
func (s TraceService) GetSessionTraceURL(ctx context.Context, req *loopsv1.GetSessionTraceURLRequest) (*loopsv1.GetSessionTraceURLResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.c.checkTraceSession(ctx, ws, req.GetSessionId()); err != nil {
		return nil, err
	}
	exp := s.c.now().Add(TraceURLTTL)
	tok, err := s.c.traceLinks.issue(ws, req.GetSessionId(), exp, s.c.now())
	if err != nil {
		return nil, err
	}
	return &loopsv1.GetSessionTraceURLResponse{Url: TracePathPrefix + tok + ".json", ExpireTime: timestamppb.New(exp)}, nil
}

// TraceDownload serves a trace link: the trace of the session it was issued for, built
// now. An unknown or expired token is NotFound.
func (c *Core) TraceDownload(ctx context.Context, token string) (session string, trace []byte, err error) {
	ws, session, ok := c.traceLinks.get(strings.TrimSuffix(token, ".json"), c.now())
	if !ok {
		return "", nil, notFound("this trace link is unknown or expired (links live %s): ask for a new one", TraceURLTTL)
	}
	t, err := c.sessionTrace(ctx, ws, session)
	if err != nil {
		return "", nil, err
	}
	return session, t.GetTraceJson(), nil
}

// checkTraceSession checks that session id names a session of workspace ws.
func (c *Core) checkTraceSession(ctx context.Context, ws, id string) error {
	switch {
	case id == "":
		return invalidArgument("session_id is required: the session whose trace to export")
	case len(id) > maxOperationIDBytes:
		return invalidArgument("session_id is %d bytes, more than any session id (%d)", len(id), maxOperationIDBytes)
	}
	_, err := c.store.GetSession(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		return notFound("session %q not found (it does not exist, or belongs to another API key's workspace)", id)
	}
	if err != nil {
		return storeErr(err, "session "+quote(id))
	}
	return nil
}

// sessionTrace draws the operations of a session's training runs and samplers: those in the
// store, with the newer state of those still in memory (pending ones, and the finished
// ones' publish and retrieval times).
func (c *Core) sessionTrace(ctx context.Context, ws, session string) (*loopsv1.SessionTrace, error) {
	if err := c.checkTraceSession(ctx, ws, session); err != nil {
		return nil, err
	}
	runs, err := c.store.ListSessionTrainingRuns(ctx, ws, session)
	if err != nil {
		return nil, storeErr(err, "session "+quote(session)+"'s training runs")
	}
	smps, err := c.store.ListSessionSamplers(ctx, ws, session, maxTraceSamplers)
	if err != nil {
		return nil, storeErr(err, "session "+quote(session)+"'s samplers")
	}
	var tracks []optrace.Track
	var ids []string           // the tracks' owners, in order
	owners := map[string]int{} // owner id -> its track
	add := func(id, name string) {
		owners[id] = len(tracks)
		ids = append(ids, id)
		tracks = append(tracks, optrace.Track{Name: name})
	}
	for _, r := range runs {
		add(r.GetId(), "training run "+r.GetId()+" ("+r.GetBaseModel()+")")
	}
	for _, s := range smps {
		add(s.GetId(), "sampler "+s.GetId()+" ("+s.GetBaseModel()+")")
	}
	live := c.ops.inMemory(ws, owners)
	budget, truncated, n := MaxTraceOperations, false, 0
	for i, id := range ids {
		if budget == 0 {
			truncated = true
			break
		}
		ops, err := c.store.ListOwnerOperations(ctx, ws, id, budget+1)
		if err != nil {
			return nil, storeErr(err, "operations of "+quote(id))
		}
		if len(ops) > budget {
			ops, truncated = ops[:budget], true
		}
		seen := make(map[string]bool, len(ops))
		for k, op := range ops {
			seen[op.GetId()] = true
			if m, ok := live[op.GetId()]; ok {
				ops[k] = m
			}
		}
		for _, m := range live {
			if store.OperationOwner(m) == id && !seen[m.GetId()] && len(ops) < budget {
				ops = append(ops, m) // not in the store yet
			}
		}
		budget -= len(ops)
		n += len(ops)
		tracks[i].Ops = ops
	}
	b, err := optrace.Encode(session, tracks)
	if err != nil {
		return nil, err
	}
	return &loopsv1.SessionTrace{SessionId: session, TraceJson: b, Operations: int32(n), Truncated: truncated}, nil
}

// inMemory returns the workspace's operations in memory that belong to one of owners, as
// they stand (by id).
func (ops *operations) inMemory(ws string, owners map[string]int) map[string]*loopsv1.Operation {
	ops.mu.Lock()
	var mine []*operation
	for _, o := range ops.byID {
		if o.workspace == ws {
			mine = append(mine, o)
		}
	}
	ops.mu.Unlock()
	out := map[string]*loopsv1.Operation{}
	for _, o := range mine {
		o.mu.Lock()
		op := o.op
		if !isDone(op) { // a pending or running one: its timeline so far
			op = cloneWithTimeline(op, o.timelineLocked())
		}
		o.mu.Unlock()
		if _, ok := owners[store.OperationOwner(op)]; ok {
			out[op.GetId()] = op
		}
	}
	return out
}

// traceLinks holds the unexpired trace links, bounded per workspace and in all.
type traceLinks struct {
	mu    sync.Mutex
	links map[string]traceLink
	per   map[string]int
}

type traceLink struct {
	ws, session string
	expires     time.Time
}

func newTraceLinks() *traceLinks {
	return &traceLinks{links: map[string]traceLink{}, per: map[string]int{}}
}

// issue stores a link to the trace of session for workspace ws and returns its token.
func (l *traceLinks) issue(ws, session string, expires, now time.Time) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.links) >= MaxTraceLinks || l.per[ws] >= MaxTraceLinksPerWorkspace {
		l.sweepLocked(now)
	}
	if n := l.per[ws]; n >= MaxTraceLinksPerWorkspace {
		return "", resourceExhausted("this workspace holds %d unexpired trace links, the most allowed: retry after some expire (links live %s)", n, TraceURLTTL)
	}
	if len(l.links) >= MaxTraceLinks {
		return "", resourceExhausted("the server holds %d unexpired trace links, the most allowed: retry later", len(l.links))
	}
	tok := randHex(24)
	l.links[tok] = traceLink{ws: ws, session: session, expires: expires}
	l.per[ws]++
	return tok, nil
}

func (l *traceLinks) get(tok string, now time.Time) (ws, session string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.links[tok]
	if !ok || now.After(t.expires) {
		return "", "", false
	}
	return t.ws, t.session, true
}

func (l *traceLinks) sweep(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(now)
}

func (l *traceLinks) sweepLocked(now time.Time) {
	for tok, t := range l.links {
		if now.After(t.expires) {
			delete(l.links, tok)
			if l.per[t.ws]--; l.per[t.ws] <= 0 {
				delete(l.per, t.ws)
			}
		}
	}
}

// cloneWithTimeline is a copy of op with timeline tl.
func cloneWithTimeline(op *loopsv1.Operation, tl *loopsv1.OperationTimeline) *loopsv1.Operation {
	out := proto.CloneOf(op)
	out.Timeline = tl
	return out
}
