// Package keysvc serves loops.v1 KeyService (API keys as records: create, list, revoke,
// whoami) and the Tinker auth routes built on it (the key-for-token exchange, the key's own
// record, revoking it), over the key directory and token issuer of package auth.
package keysvc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// MaxNameLen bounds a key's name.
const MaxNameLen = 128

// Service is the KeyService and the Tinker auth routes.
type Service struct {
	keys        *auth.Keys
	maxInFlight int
	spend       KeySpend
}

// KeySpend reports an API key's budgets with what it spent against each (core.Core).
type KeySpend interface {
	// KeyBudgets is k's budgets and spend; none when it has no budget or no price sheet is
	// loaded.
	KeyBudgets(ctx context.Context, k *loopsv1.ApiKey) ([]*loopsv1.WorkspaceBudget, error)
}

// WithSpend makes ListKeys and UpdateKey report each budgeted key's spend
// (ApiKey.budget_status) from sp, and returns s.
func (s *Service) WithSpend(sp KeySpend) *Service {
	s.spend = sp
	return s
}

// withStatus is k, cloned with its budget_status when it has a budget and s reports spend
// (k may be the directory's cached record: it is never changed).
func (s *Service) withStatus(ctx context.Context, k *loopsv1.ApiKey) (*loopsv1.ApiKey, error) {
	if s.spend == nil || (k.GetBudgetUsdMonth() == "" && k.GetBudgetUsdTotal() == "") {
		return k, nil
	}
	st, err := s.spend.KeyBudgets(ctx, k)
	if err != nil || len(st) == 0 {
		return k, err
	}
	out := proto.CloneOf(k)
	out.BudgetStatus = st
	return out, nil
}

var _ loopsv1connect.KeyServiceHandler = (*Service)(nil)

// New returns the service over keys (which must have a directory and a token issuer:
// auth.Keys.WithRecords). maxInFlight is the per-key cap whoami reports (0: none).
func New(keys *auth.Keys, maxInFlight int) *Service {
	if maxInFlight < 0 {
		maxInFlight = 0
	}
	return &Service{keys: keys, maxInFlight: maxInFlight}
}

// scope is the workspace a call acts on: any ("" for all) for an operator, the caller's own
// for an admin key. Another workspace named by an admin is not found, as every other
// workspace's things are; a member key may not manage keys at all.
func scope(ctx context.Context, named string) (string, error) {
	if auth.IsOperator(ctx) {
		if named != "" {
			if err := auth.ValidateWorkspaceName(named); err != nil {
				return "", connect.NewError(connect.CodeInvalidArgument, errors.New("workspace: use 1 to 64 letters, digits, '_' or '-', not starting with '-'"))
			}
		}
		return named, nil
	}
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return "", err
	}
	if !auth.IsAdmin(ctx) {
		return "", connect.NewError(connect.CodePermissionDenied, errors.New(
			"managing API keys needs a workspace admin key or an operator key: ask an operator for one (loops keys create --workspace WS --role admin)"))
	}
	if named != "" && named != ws {
		return "", connect.NewError(connect.CodeNotFound, fmt.Errorf("workspace %q not found", named))
	}
	return ws, nil
}

func (s *Service) directory() (*auth.Directory, error) {
	if d := s.keys.Directory(); d != nil {
		return d, nil
	}
	return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("this server keeps no API key records"))
}

// CreateKey makes a key and returns its secret once.
func (s *Service) CreateKey(ctx context.Context, m *loopsv1.CreateKeyRequest) (*loopsv1.CreateKeyResponse, error) {
	ws, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if ws == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("workspace is required: name the workspace the key is for (loops keys create --workspace WS)"))
	}
	role := m.GetRole()
	switch role {
	case loopsv1.KeyRole_KEY_ROLE_UNSPECIFIED:
		role = loopsv1.KeyRole_KEY_ROLE_MEMBER
	case loopsv1.KeyRole_KEY_ROLE_MEMBER, loopsv1.KeyRole_KEY_ROLE_ADMIN:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"role %v cannot be created: use KEY_ROLE_MEMBER or KEY_ROLE_ADMIN (operator keys are given to loops serve by flag)", role))
	}
	if err := validName(m.GetName()); err != nil {
		return nil, err
	}
	d, err := s.directory()
	if err != nil {
		return nil, err
	}
	month, err := keyBudget("budget_usd_month", m.GetBudgetUsdMonth())
	if err != nil {
		return nil, err
	}
	total, err := keyBudget("budget_usd_total", m.GetBudgetUsdTotal())
	if err != nil {
		return nil, err
	}
	rec, secret, err := d.Create(ctx, ws, role, m.GetName())
	if err == nil && (month != "" || total != "") {
		rec, err = d.SetBudgets(ctx, ws, rec.GetId(), month, total)
	}
	if errors.Is(err, auth.ErrTooManyKeys) {
		return nil, connect.NewError(connect.CodeResourceExhausted, err)
	}
	if err != nil {
		return nil, internal(err)
	}
	return &loopsv1.CreateKeyResponse{Key: rec, Secret: secret}, nil
}

func validName(name string) error {
	if len(name) > MaxNameLen {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("name is %d bytes long: use at most %d", len(name), MaxNameLen))
	}
	for _, c := range name {
		if c < ' ' || c == 0x7f {
			return connect.NewError(connect.CodeInvalidArgument, errors.New("name: control characters are not allowed"))
		}
	}
	return nil
}

// ListKeys lists stored keys, newest first.
func (s *Service) ListKeys(ctx context.Context, m *loopsv1.ListKeysRequest) (*loopsv1.ListKeysResponse, error) {
	ws, err := scope(ctx, m.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if m.GetLimit() < 0 || m.GetLimit() > store.MaxPageLimit {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("limit %d: use 0 (the default, %d) to %d", m.GetLimit(), store.DefaultPageLimit, store.MaxPageLimit))
	}
	d, err := s.directory()
	if err != nil {
		return nil, err
	}
	keys, err := d.List(ctx, ws, int(m.GetLimit()))
	if err != nil {
		return nil, internal(err)
	}
	if m.GetLiveOnly() {
		live := keys[:0]
		for _, k := range keys {
			if k.GetRevokeTime() == nil {
				live = append(live, k)
			}
		}
		keys = live
	}
	out := make([]*loopsv1.ApiKey, len(keys))
	for i, k := range keys {
		if out[i], err = s.withStatus(ctx, k); err != nil {
			return nil, err
		}
	}
	return &loopsv1.ListKeysResponse{Keys: out}, nil
}

// RevokeKey revokes a stored key. A member key may revoke only itself.
func (s *Service) RevokeKey(ctx context.Context, m *loopsv1.RevokeKeyRequest) (*loopsv1.ApiKey, error) {
	id := m.GetId()
	if !validKeyID(id) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("id %q: a key id is \"key-\" and 16 hex digits (loops keys list shows them)", clip(id)))
	}
	var ws string
	if who, _ := auth.IdentityOf(ctx); who.Source == auth.SourceRecord && who.KeyID == id && !auth.IsOperator(ctx) {
		ws = who.Workspace // any key may revoke itself
	} else {
		var err error
		if ws, err = scope(ctx, ""); err != nil {
			return nil, err
		}
	}
	d, err := s.directory()
	if err != nil {
		return nil, err
	}
	rec, err := d.Revoke(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("API key %s not found (keys given by flag or key file cannot be revoked here: remove them from the server's configuration)", id))
	}
	if err != nil {
		return nil, internal(err)
	}
	return rec, nil
}

// UpdateKey changes a stored key's budgets: an operator any key's, an admin key its
// workspace's keys'.
func (s *Service) UpdateKey(ctx context.Context, m *loopsv1.UpdateKeyRequest) (*loopsv1.ApiKey, error) {
	id := m.GetId()
	if !validKeyID(id) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("id %q: a key id is \"key-\" and 16 hex digits (loops keys list shows them)", clip(id)))
	}
	ws, err := scope(ctx, "")
	if err != nil {
		return nil, err
	}
	if m.BudgetUsdMonth == nil && m.BudgetUsdTotal == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("nothing to update: set budget_usd_month or budget_usd_total (loops keys update KEY --budget-usd-month 25)"))
	}
	d, err := s.directory()
	if err != nil {
		return nil, err
	}
	rec, err := d.Get(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errKeyNotFound(id)
	}
	if err != nil {
		return nil, internal(err)
	}
	month, total := rec.GetBudgetUsdMonth(), rec.GetBudgetUsdTotal()
	if m.BudgetUsdMonth != nil {
		if month, err = keyBudget("budget_usd_month", m.GetBudgetUsdMonth()); err != nil {
			return nil, err
		}
	}
	if m.BudgetUsdTotal != nil {
		if total, err = keyBudget("budget_usd_total", m.GetBudgetUsdTotal()); err != nil {
			return nil, err
		}
	}
	rec, err = d.SetBudgets(ctx, ws, id, month, total)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errKeyNotFound(id)
	}
	if err != nil {
		return nil, internal(err)
	}
	return s.withStatus(ctx, rec)
}

func errKeyNotFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("API key %s not found (loops keys list shows the workspace's keys)", id))
}

// keyBudget checks a key budget given as USD and returns it as its record keeps it: ""
// for none (empty or 0).
func keyBudget(name, s string) (string, error) {
	if s == "" {
		return "", nil
	}
	v, err := policy.ParseBudget(s)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s %q: %v (US dollars such as \"25.50\", at most 6 decimal places; 0 for no budget)", name, clip(s), err))
	}
	if v == 0 {
		return "", nil
	}
	return v.String(), nil
}

// WhoAmI says who the caller is.
func (s *Service) WhoAmI(ctx context.Context, _ *loopsv1.WhoAmIRequest) (*loopsv1.WhoAmIResponse, error) {
	return s.Identity(ctx)
}

// Identity is whoami's answer for the request's caller.
func (s *Service) Identity(ctx context.Context) (*loopsv1.WhoAmIResponse, error) {
	who, ok := auth.IdentityOf(ctx)
	if !ok {
		_, err := auth.RequireWorkspace(ctx)
		if err == nil {
			err = connect.NewError(connect.CodeUnauthenticated, errors.New("missing API key: send it in the X-API-Key header"))
		}
		return nil, err
	}
	return &loopsv1.WhoAmIResponse{Workspace: who.Workspace, KeyId: who.KeyID, Role: who.Role,
		Source: string(who.Source), MaxRequestsInFlight: int32(min(s.maxInFlight, 1<<30)), Key: who.Record}, nil
}

// Token exchanges the request's workspace key for an access token (POST
// /api/v1/auth/token). A token is not exchanged for another: that would let a token
// outlive its key's lifetime bound without the key.
func (s *Service) Token(ctx context.Context) (string, error) {
	if _, err := auth.RequireWorkspace(ctx); err != nil {
		return "", err
	}
	who, _ := auth.IdentityOf(ctx)
	if who.Token {
		return "", connect.NewError(connect.CodePermissionDenied, errors.New("send the API key (tml-…) to exchange it for a token, not a token"))
	}
	t := s.keys.Tokens()
	if t == nil {
		return "", connect.NewError(connect.CodeFailedPrecondition, errors.New("this server issues no access tokens: use the API key itself"))
	}
	tok, err := t.Issue(ctx, who)
	if err != nil {
		return "", internal(err)
	}
	return tok, nil
}

// RevokeSelf revokes the request's own key (DELETE /api/v1/auth/apikey/me). Only stored
// keys can be revoked.
func (s *Service) RevokeSelf(ctx context.Context) error {
	if _, err := auth.RequireWorkspace(ctx); err != nil {
		return err
	}
	who, _ := auth.IdentityOf(ctx)
	if who.Source != auth.SourceRecord {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"this key was given to the server by flag or key file (or the server is in open mode), so it cannot be revoked over the API: the operator removes it from the server's configuration"))
	}
	d, err := s.directory()
	if err != nil {
		return err
	}
	if _, err := d.Revoke(ctx, who.Workspace, who.KeyID); err != nil {
		return internal(err)
	}
	return nil
}

func internal(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(connect.CodeInternal, err)
}

func validKeyID(id string) bool {
	h, ok := strings.CutPrefix(id, "key-")
	if !ok || len(h) != 16 {
		return false
	}
	_, err := strconv.ParseUint(h, 16, 64)
	return err == nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
