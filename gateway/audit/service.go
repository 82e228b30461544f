package audit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Bounds of ListAuditEvents' filters.
const (
	maxFilterLen = 256
	pageList     = "audit"
)

// Reader is what the service reads.
type Reader interface {
	ListAuditEvents(ctx context.Context, workspace string, q store.AuditQuery) ([]store.AuditEvent, error)
	CheckpointStorage(ctx context.Context, workspace string) (store.CheckpointStorage, error)
}

// Service is loops.v1.AuditService over the store: a workspace reads only its own log.
type Service struct {
	st     Reader
	tokens *store.PageTokens
	rec    *Recorder
	prices *prices.Watcher
}

// flushWait bounds how long a list waits for the events recorded before it to be written.
const flushWait = 2 * time.Second

// NewService returns the service reading st, with page tokens signed by tokens; a list
// first waits (briefly) for rec to write what was recorded before it, so that a caller
// sees its own calls. rec may be nil.
func NewService(st Reader, tokens *store.PageTokens, rec *Recorder) *Service {
	return &Service{st: st, tokens: tokens, rec: rec}
}

// WithPrices makes GetCheckpointStorage report the storage price of the sheet w has in
// force (nil: none), and returns s.
func (s *Service) WithPrices(w *prices.Watcher) *Service {
	s.prices = w
	return s
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// ListAuditEvents lists the workspace's events, newest first, in pages.
func (s *Service) ListAuditEvents(ctx context.Context, req *loopsv1.ListAuditEventsRequest) (*loopsv1.ListAuditEventsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	q, err := s.query(ws, req)
	if err != nil {
		return nil, err
	}
	if s.rec != nil {
		fctx, cancel := context.WithTimeout(ctx, flushWait)
		_ = s.rec.Flush(fctx) // past the wait, the list shows what is written
		cancel()
	}
	size := q.PageSize()
	q.Limit = size + 1 // one more tells whether a next page exists
	evs, err := s.st.ListAuditEvents(ctx, ws, q)
	if err != nil {
		return nil, err
	}
	out := &loopsv1.ListAuditEventsResponse{Events: make([]*loopsv1.AuditEvent, 0, min(len(evs), size))}
	for i, e := range evs {
		if i == size {
			out.NextPageToken = s.tokens.Encode(ws, pageList, &store.Cursor{ID: strconv.FormatInt(evs[i-1].Seq, 10)})
			break
		}
		out.Events = append(out.Events, ToProto(e))
	}
	return out, nil
}

// query checks req and turns it into a store query.
func (s *Service) query(ws string, req *loopsv1.ListAuditEventsRequest) (store.AuditQuery, error) {
	var q store.AuditQuery
	if n := req.GetPageSize(); n < 0 || n > store.MaxPageLimit {
		return q, invalid("page_size %d is out of range: use 1 to %d (0 for %d)", n, store.MaxPageLimit, store.DefaultPageLimit)
	}
	q.Limit = int(req.GetPageSize())
	for name, v := range map[string]string{"key_id": req.GetKeyId(), "action": req.GetAction(), "resource": req.GetResource()} {
		if len(v) > maxFilterLen {
			return q, invalid("%s is %d bytes long, over the %d-byte limit", name, len(v), maxFilterLen)
		}
	}
	q.KeyID, q.Action, q.Resource = req.GetKeyId(), req.GetAction(), req.GetResource()
	for name, t := range map[string]*timestamppb.Timestamp{"start_time": req.GetStartTime(), "end_time": req.GetEndTime()} {
		if t != nil {
			if err := t.CheckValid(); err != nil {
				return q, invalid("%s is not a valid timestamp: %v", name, err)
			}
		}
	}
	if req.GetStartTime() != nil {
		q.From = req.GetStartTime().AsTime()
	}
	if req.GetEndTime() != nil {
		q.To = req.GetEndTime().AsTime()
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.To.After(q.From) {
		return q, invalid("end_time %s is not after start_time %s", q.To.Format("2006-01-02T15:04:05Z07:00"), q.From.Format("2006-01-02T15:04:05Z07:00"))
	}
	if tok := req.GetPageToken(); tok != "" {
		c, err := s.tokens.Decode(ws, pageList, tok)
		if err != nil {
			return q, invalid("page_token: %v; pass the next_page_token of the previous page unchanged", err)
		}
		seq, err := strconv.ParseInt(c.ID, 10, 64)
		if err != nil || seq <= 0 {
			return q, invalid("page_token does not name a position in the audit log")
		}
		q.Before = seq
	}
	return q, nil
}

// GetCheckpointStorage returns the workspace's checkpoint count and bytes.
func (s *Service) GetCheckpointStorage(ctx context.Context, _ *loopsv1.GetCheckpointStorageRequest) (*loopsv1.GetCheckpointStorageResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := s.st.CheckpointStorage(ctx, ws)
	if err != nil {
		return nil, err
	}
	out := &loopsv1.GetCheckpointStorageResponse{CheckpointCount: cs.Checkpoints, SizeBytes: cs.Bytes}
	if s.prices != nil {
		if rate, ok := s.prices.Current().Rate(ws, "", store.UsageCheckpointByteSeconds, ""); ok {
			out.RateUsdPerGbMonth = rate.String()
		}
	}
	return out, nil
}

// ToProto is the loops.v1 form of an event.
func ToProto(e store.AuditEvent) *loopsv1.AuditEvent {
	return &loopsv1.AuditEvent{
		Seq: e.Seq, Time: timestamppb.New(e.Time), KeyId: e.KeyID, ClientAddr: e.ClientAddr, Surface: e.Surface,
		Action: e.Action, Event: e.Event, Resource: e.Resource, Target: e.Target, HttpStatus: int32(e.Status), Code: e.Code,
	}
}
