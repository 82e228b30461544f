package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

// Store is what the service keeps its requests, audit events and deliveries in.
type Store interface {
	store.AccessStore
}

// Options configure a Service.
type Options struct {
	// Store keeps the requests and webhook deliveries.
	Store Store
	// Policy is the workspace policy the grants change; it is given the grants in force.
	Policy *policy.Enforcer
	// Models lists the served base models with their limits (the catalog a grant is
	// checked against).
	Models func() []*loopsv1.ModelInfo
	// MaxPending bounds a workspace's pending requests (default 100).
	MaxPending int
	// Webhook is the operator's webhook (no URL: none).
	Webhook WebhookOptions
	// SweepInterval is how often expired grants are recorded and due deliveries sent
	// (default 5 s).
	SweepInterval time.Duration
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
	// Logger logs sweeps and deliveries (default slog.Default()).
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultMaxPending    = 100
	DefaultSweepInterval = 5 * time.Second
)

// Service is the AccessService and the sweep of expiring grants and webhook deliveries.
type Service struct {
	o    Options
	hook *webhook
	// reloadMu orders Reloads (the sweep's and a grant's), so that an older read of the
	// grants never replaces a newer one in the policy. Only Reload takes it.
	reloadMu sync.Mutex
	stop     context.CancelFunc
	done     chan struct{}
}

var _ loopsv1connect.AccessServiceHandler = (*Service)(nil)

// New returns the service; Start runs its sweep.
func New(o Options) *Service {
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Models == nil {
		o.Models = func() []*loopsv1.ModelInfo { return nil }
	}
	o.Policy.SetClock(o.Now)
	return &Service{o: o, hook: newWebhook(o.Webhook, o.Store, o.Now, o.Logger)}
}

// Start loads the grants in force into the policy, then sweeps every SweepInterval until
// Close: expired grants are recorded and due webhook deliveries sent.
func (s *Service) Start(ctx context.Context) error {
	if err := s.Reload(ctx); err != nil {
		return err
	}
	ctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.o.SweepInterval)
		defer t.Stop()
		for {
			s.Sweep(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Close stops the sweep and waits for it.
func (s *Service) Close() error {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	return nil
}

// Sweep records the grants expired by now (each with its audit event and webhook event),
// gives the policy the grants in force, and sends the due webhook deliveries.
func (s *Service) Sweep(ctx context.Context) {
	if err := s.expire(ctx); err != nil {
		s.o.Logger.Warn("access: expiring grants", "err", err)
	}
	if err := s.Reload(ctx); err != nil {
		s.o.Logger.Warn("access: loading grants", "err", err)
	}
	s.hook.deliverDue(ctx)
}

// Reload gives the policy the grants in force, from the store (another gateway's
// decisions and a restart included).
func (s *Service) Reload(ctx context.Context) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rs, err := s.o.Store.GrantedAccessRequests(ctx)
	if err != nil {
		return err
	}
	gs := make([]policy.Grant, 0, len(rs))
	for _, r := range rs {
		gs = append(gs, grantOf(r))
	}
	s.o.Policy.SetGrants(gs)
	return nil
}

func grantOf(r *loopsv1.AccessRequest) policy.Grant {
	g := r.GetGranted()
	out := policy.Grant{Workspace: r.GetWorkspace(), Model: g.GetModel(), MaxSequenceLength: int(g.GetMaxSequenceLength()),
		MaxLoraRank: int(g.GetMaxLoraRank()), MaxConcurrentRuns: int(g.GetMaxConcurrentRuns()), FullFinetune: g.GetFullFinetune()}
	if r.GetExpireTime() != nil {
		out.Expires = r.GetExpireTime().AsTime()
	}
	return out
}

func (s *Service) expire(ctx context.Context) error {
	rs, err := s.o.Store.GrantedAccessRequests(ctx)
	if err != nil {
		return err
	}
	now := s.o.Now()
	var errs []error
	for _, r := range rs {
		if r.GetExpireTime() == nil || now.Before(r.GetExpireTime().AsTime()) {
			continue
		}
		next := proto.CloneOf(r)
		next.State, next.UpdateTime = loopsv1.AccessState_ACCESS_STATE_EXPIRED, timestamppb.New(now)
		ev := auditEvent(r.GetWorkspace(), now, auth.Caller{}, "access expiry sweep", "workspace_policy", "workspace_policy_revert", r.GetId())
		if err := s.o.Store.TransitionAccessRequest(ctx, next, loopsv1.AccessState_ACCESS_STATE_GRANTED, ev, s.event(ctx, "access_request.expired", next)); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, err)
			continue
		}
		s.o.Logger.Info("access: grant expired", "workspace", r.GetWorkspace(), "request", r.GetId(), "model", r.GetGranted().GetModel())
	}
	return errors.Join(errs...)
}

// auditEvent is the audit record of a decision (a change of a workspace's policy, or a
// denial), written in the transaction that makes it.
// action is the procedure that made it (the sweep: "access expiry sweep").
func auditEvent(ws string, at time.Time, who auth.Caller, action, resource, event, target string) store.OwnedAuditEvent {
	return store.OwnedAuditEvent{Workspace: ws, Event: store.AuditEvent{
		Time: at, KeyID: who.KeyID, ClientAddr: who.Addr, Surface: "access",
		Action: action, Event: event, Resource: resource, Target: target,
		Status: 200, Code: "ok"}}
}

// scope is the workspace a call acts on and whether the caller may decide its requests:
// an operator must name the workspace; a workspace key acts on its own (another named is
// not found, as every other workspace's things are), as an admin when its role is admin.
func scope(ctx context.Context, named string) (ws string, admin bool, err error) {
	if auth.IsOperator(ctx) {
		if named == "" {
			return "", false, connect.NewError(connect.CodeInvalidArgument, errors.New("an operator key names the workspace (--workspace WS)"))
		}
		if err := auth.ValidateWorkspaceName(named); err != nil {
			return "", false, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("workspace %q is not a workspace name", named))
		}
		return named, true, nil
	}
	ws, err = auth.RequireWorkspace(ctx)
	if err != nil {
		return "", false, err
	}
	if named != "" && named != ws {
		return "", false, connect.NewError(connect.CodeNotFound, fmt.Errorf("workspace %q not found", named))
	}
	return ws, auth.IsAdmin(ctx), nil
}

func requireAdmin(admin bool, what string) error {
	if admin {
		return nil
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
		"%s needs a workspace admin key or an operator key, and this key is a member's: ask your workspace's admin (loops keys create --role admin makes one)", what))
}

// callerKey is the id of the calling key.
func callerKey(ctx context.Context) string {
	if id, ok := auth.IdentityOf(ctx); ok && id.KeyID != "" {
		return id.KeyID
	}
	return auth.CallerOf(ctx).KeyID
}

// RequestAccess files (or updates) the caller's request.
func (s *Service) RequestAccess(ctx context.Context, m *loopsv1.RequestAccessRequest) (*loopsv1.AccessRequest, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidateRequest(m); err != nil {
		return nil, err
	}
	if err := s.checkCatalog(m.GetAmounts()); err != nil {
		return nil, err
	}
	by := callerKey(ctx)
	if by == "" {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("an access request needs an API key"))
	}
	now := timestamppb.New(s.o.Now())
	r := &loopsv1.AccessRequest{Id: newID("acr"), Workspace: ws, RequestedBy: by, Requested: proto.CloneOf(m.GetAmounts()),
		Reason: m.GetReason(), State: loopsv1.AccessState_ACCESS_STATE_PENDING, CreateTime: now, UpdateTime: now}
	out, created, err := s.o.Store.PutAccessRequest(ctx, r, s.o.MaxPending, s.event(ctx, "access_request.created", r))
	if errors.Is(err, store.ErrLimit) {
		return nil, errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, fmt.Errorf(
			"workspace %q has %d access requests pending, its limit: ask a workspace admin to decide them (loops access list), then retry", ws, s.o.MaxPending))
	}
	if err != nil {
		return nil, err
	}
	if !created {
		s.o.Logger.Info("access: request updated", "workspace", ws, "request", out.GetId())
	}
	return out, nil
}

// ListAccessRequests lists the workspace's requests (a member: its own).
func (s *Service) ListAccessRequests(ctx context.Context, m *loopsv1.ListAccessRequestsRequest) (*loopsv1.ListAccessRequestsResponse, error) {
	ws, admin, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if m.GetLimit() < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("limit must be 0 (the default, 100) or positive"))
	}
	if _, ok := loopsv1.AccessState_name[int32(m.GetState())]; !ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("state %d is not an AccessState", m.GetState()))
	}
	q := store.AccessQuery{State: m.GetState(), Limit: int(m.GetLimit())}
	if !admin {
		q.RequestedBy = callerKey(ctx)
	}
	rs, err := s.o.Store.ListAccessRequests(ctx, ws, q)
	if err != nil {
		return nil, err
	}
	return &loopsv1.ListAccessRequestsResponse{Requests: rs}, nil
}

// GetAccessRequest returns one request (a member: its own only).
func (s *Service) GetAccessRequest(ctx context.Context, m *loopsv1.GetAccessRequestRequest) (*loopsv1.AccessRequest, error) {
	ws, admin, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	return s.get(ctx, ws, m.GetId(), admin)
}

func (s *Service) get(ctx context.Context, ws, id string, admin bool) (*loopsv1.AccessRequest, error) {
	if id == "" || len(id) > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("id is required: the access request's id (acr-…)"))
	}
	r, err := s.o.Store.GetAccessRequest(ctx, ws, id)
	if err == nil && !admin && r.GetRequestedBy() != callerKey(ctx) {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("access request %q not found", id))
	}
	return r, err
}

// GrantAccessRequest grants a pending request.
func (s *Service) GrantAccessRequest(ctx context.Context, m *loopsv1.GrantAccessRequestRequest) (*loopsv1.AccessRequest, error) {
	ws, admin, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(admin, "granting access"); err != nil {
		return nil, err
	}
	if err := ValidateGrant(m); err != nil {
		return nil, err
	}
	r, err := s.get(ctx, ws, m.GetId(), true)
	if err != nil {
		return nil, err
	}
	if err := pending(r); err != nil {
		return nil, err
	}
	amounts := r.GetRequested()
	if m.GetAmounts() != nil {
		amounts = m.GetAmounts()
		if amounts.GetModel() != r.GetRequested().GetModel() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
				"amounts.model is %q but the request is for %q: a grant is for the model asked for (deny it and let the member ask for the other)", amounts.GetModel(), r.GetRequested().GetModel()))
		}
	}
	if err := s.checkCatalog(amounts); err != nil {
		return nil, err
	}
	now := s.o.Now()
	next := proto.CloneOf(r)
	next.State, next.UpdateTime = loopsv1.AccessState_ACCESS_STATE_GRANTED, timestamppb.New(now)
	next.DecidedBy, next.DecisionReason, next.Granted = callerKey(ctx), m.GetReason(), proto.CloneOf(amounts)
	if d := m.GetDurationSeconds(); d > 0 {
		next.ExpireTime = timestamppb.New(now.Add(time.Duration(d) * time.Second))
	}
	model := amounts.GetModel()
	next.PolicyBefore = limitsJSON(model, s.o.Policy.ModelLimits(ws, model))
	next.PolicyAfter = limitsJSON(model, s.o.Policy.ModelLimits(ws, model, grantOf(next)))
	ev := auditEvent(ws, now, auth.CallerOf(ctx), loopsv1connect.AccessServiceGrantAccessRequestProcedure, "workspace_policy", "workspace_policy_change", r.GetId())
	if err := s.o.Store.TransitionAccessRequest(ctx, next, loopsv1.AccessState_ACCESS_STATE_PENDING, ev, s.event(ctx, "access_request.granted", next)); err != nil {
		return nil, decided(r.GetId(), err)
	}
	if err := s.Reload(ctx); err != nil {
		// The grant is stored: the next sweep gives it to the policy.
		s.o.Logger.Warn("access: loading grants after a grant", "request", r.GetId(), "err", err)
	}
	return next, nil
}

// DenyAccessRequest denies a pending request.
func (s *Service) DenyAccessRequest(ctx context.Context, m *loopsv1.DenyAccessRequestRequest) (*loopsv1.AccessRequest, error) {
	ws, admin, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(admin, "denying access"); err != nil {
		return nil, err
	}
	if err := ValidateReason(m.GetReason(), true); err != nil {
		return nil, err
	}
	r, err := s.get(ctx, ws, m.GetId(), true)
	if err != nil {
		return nil, err
	}
	if err := pending(r); err != nil {
		return nil, err
	}
	now := s.o.Now()
	next := proto.CloneOf(r)
	next.State, next.UpdateTime = loopsv1.AccessState_ACCESS_STATE_DENIED, timestamppb.New(now)
	next.DecidedBy, next.DecisionReason = callerKey(ctx), m.GetReason()
	ev := auditEvent(ws, now, auth.CallerOf(ctx), loopsv1connect.AccessServiceDenyAccessRequestProcedure, "access_request", "access_request_denied", r.GetId())
	if err := s.o.Store.TransitionAccessRequest(ctx, next, loopsv1.AccessState_ACCESS_STATE_PENDING, ev, s.event(ctx, "access_request.denied", next)); err != nil {
		return nil, decided(r.GetId(), err)
	}
	return next, nil
}

// ListWebhookDeliveries lists the workspace's deliveries (admins and operators).
func (s *Service) ListWebhookDeliveries(ctx context.Context, m *loopsv1.ListWebhookDeliveriesRequest) (*loopsv1.ListWebhookDeliveriesResponse, error) {
	ws, admin, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(admin, "listing webhook deliveries"); err != nil {
		return nil, err
	}
	if m.GetLimit() < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("limit must be 0 (the default, 100) or positive"))
	}
	ds, err := s.o.Store.ListWebhookDeliveries(ctx, ws, int(m.GetLimit()))
	if err != nil {
		return nil, err
	}
	return &loopsv1.ListWebhookDeliveriesResponse{Deliveries: ds}, nil
}

func pending(r *loopsv1.AccessRequest) error {
	if r.GetState() == loopsv1.AccessState_ACCESS_STATE_PENDING {
		return nil
	}
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("access request %s is %s already: only a pending request is decided (the member files a new one)",
		r.GetId(), stateName(r.GetState())))
}

func decided(id string, err error) error {
	if errors.Is(err, store.ErrConflict) {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("access request %s was decided meanwhile", id))
	}
	return err
}

// stateName is a state's name without its prefix: "pending", "granted", …
func stateName(st loopsv1.AccessState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "ACCESS_STATE_"))
}

// checkCatalog refuses amounts the served catalog cannot give, naming the maximum.
func (s *Service) checkCatalog(a *loopsv1.AccessAmounts) error {
	models := s.o.Models()
	i := slices.IndexFunc(models, func(m *loopsv1.ModelInfo) bool { return m.GetName() == a.GetModel() })
	if i < 0 {
		names := make([]string, 0, len(models))
		for _, m := range models {
			names = append(names, m.GetName())
		}
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("base model %q is not served here: ask for one of %s", a.GetModel(), strings.Join(names, ", ")))
	}
	m := models[i]
	if mx := m.GetMaxSequenceLength(); mx > 0 && a.GetMaxSequenceLength() > mx {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"max_sequence_length %d is more than %s serves: the maximum is %d", a.GetMaxSequenceLength(), a.GetModel(), mx))
	}
	if mx := m.GetMaxLoraRank(); mx > 0 && a.GetMaxLoraRank() > mx {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"max_lora_rank %d is more than %s serves: the maximum is %d", a.GetMaxLoraRank(), a.GetModel(), mx))
	}
	if a.GetFullFinetune() && !m.GetFullFinetune() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"full_finetune: the backend serving %s does not do full fine-tuning (LoRA rank 0); ask without it", a.GetModel()))
	}
	return nil
}

// limitsJSON is the audit view of a workspace's limits on a model.
func limitsJSON(model string, l policy.Limits) string {
	b, _ := json.Marshal(struct {
		Model             string `json:"model"`
		Allowed           bool   `json:"allowed"`
		MaxSequenceLength int    `json:"max_sequence_length"`
		MaxLoraRank       int    `json:"max_lora_rank"`
		MaxConcurrentRuns int    `json:"max_concurrent_runs"`
		FullFinetune      bool   `json:"full_finetune,omitempty"`
	}{model, l.Allows(model), l.MaxSequenceLength, l.MaxLoraRank, l.MaxConcurrentRuns, l.AllowFullFinetune})
	return string(b)
}

// newID returns prefix-<16 hex digits>.
func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}
