package access_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/loops-dev/loops/gateway/access"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// clock is an injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var catalog = []*loopsv1.ModelInfo{
	{Name: "small", MaxSequenceLength: 4096, MaxLoraRank: 64, FullFinetune: true},
	{Name: "big", MaxSequenceLength: 32768, MaxLoraRank: 128},
}

type env struct {
	st  *sqlite.Store
	pol *policy.Enforcer
	clk *clock
	svc *access.Service
	dir string
}

func newEnv(t *testing.T, hook access.WebhookOptions) *env {
	dir := t.TempDir()
	e := &env{dir: dir, clk: &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}}
	e.open(t, hook)
	return e
}

// open opens the store and a new service on it (a restart of the gateway).
func (e *env) open(t *testing.T, hook access.WebhookOptions) {
	st, err := sqlite.Open(t.Context(), filepath.Join(e.dir, "loops.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	p, err := policy.Parse([]byte("default:\n  models: [small]\n  max_sequence_length: 128\n  max_lora_rank: 8\n  max_concurrent_runs: 1\n"))
	require.NoError(t, err)
	pol, err := policy.NewEnforcer(p, []string{"small", "big"})
	require.NoError(t, err)
	svc := access.New(access.Options{Store: st, Policy: pol, Models: func() []*loopsv1.ModelInfo { return catalog },
		MaxPending: 3, Webhook: hook, Now: e.clk.Now, SweepInterval: time.Hour})
	require.NoError(t, svc.Reload(t.Context()))
	e.st, e.pol, e.svc = st, pol, svc
}

func member(t *testing.T, ws, key string) context.Context {
	ctx := auth.WithWorkspace(t.Context(), ws)
	ctx = auth.WithCaller(ctx, auth.Caller{KeyID: key, Addr: "127.0.0.1"})
	return auth.WithIdentity(ctx, auth.Identity{Workspace: ws, KeyID: key, Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: auth.SourceRecord})
}

func admin(t *testing.T, ws, key string) context.Context {
	ctx := auth.WithWorkspace(t.Context(), ws)
	ctx = auth.WithCaller(ctx, auth.Caller{KeyID: key, Addr: "127.0.0.1"})
	return auth.WithIdentity(ctx, auth.Identity{Workspace: ws, KeyID: key, Role: loopsv1.KeyRole_KEY_ROLE_ADMIN, Source: auth.SourceRecord})
}

func requireCode(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, connect.CodeOf(err), err.Error())
	require.Contains(t, err.Error(), msg)
}

func ask(model string, seq int32) *loopsv1.RequestAccessRequest {
	return &loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: model, MaxSequenceLength: seq}, Reason: "bigger experiments"}
}

// TestRequestGrantDenyAndIsolation: a member's request (a second for the same model updates
// it), bounds on input and on pending requests, a member cannot grant, an admin of another
// workspace neither sees nor grants it, a grant beyond the catalog is refused with the
// maximum, and a grant changes the policy with its audit event in the same transaction.
func TestRequestGrantDenyAndIsolation(t *testing.T) {
	e := newEnv(t, access.WebhookOptions{})
	svc := e.svc
	alice, bob := member(t, "team-a", "key-alice"), member(t, "team-a", "key-bob")
	adminA, adminB := admin(t, "team-a", "key-admin-a"), admin(t, "team-b", "key-admin-b")

	r, err := svc.RequestAccess(alice, ask("big", 1024))
	require.NoError(t, err)
	require.Equal(t, loopsv1.AccessState_ACCESS_STATE_PENDING, r.GetState())
	again, err := svc.RequestAccess(alice, ask("big", 2048))
	require.NoError(t, err)
	require.Equal(t, r.GetId(), again.GetId(), "one open request per member and model")
	require.Equal(t, int32(2048), again.GetRequested().GetMaxSequenceLength())

	// Bad input: clear 4xx.
	_, err = svc.RequestAccess(alice, &loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: "big"}})
	requireCode(t, err, connect.CodeInvalidArgument, "reason is required")
	_, err = svc.RequestAccess(alice, &loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: "big", MaxLoraRank: -1}, Reason: "x"})
	requireCode(t, err, connect.CodeInvalidArgument, "max_lora_rank is -1")
	_, err = svc.RequestAccess(alice, &loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: "big"}, Reason: string(make([]byte, 2000))})
	requireCode(t, err, connect.CodeInvalidArgument, "over the limit of 1024")
	_, err = svc.RequestAccess(alice, ask("huge", 0))
	requireCode(t, err, connect.CodeInvalidArgument, `base model "huge" is not served here: ask for one of small, big`)
	_, err = svc.RequestAccess(alice, ask("big", 65536))
	requireCode(t, err, connect.CodeInvalidArgument, "the maximum is 32768")

	// Members see their own requests only; the admin sees the workspace's.
	_, err = svc.RequestAccess(bob, ask("small", 256))
	require.NoError(t, err)
	list, err := svc.ListAccessRequests(alice, &loopsv1.ListAccessRequestsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRequests(), 1)
	_, err = svc.GetAccessRequest(bob, &loopsv1.GetAccessRequestRequest{Id: r.GetId()})
	requireCode(t, err, connect.CodeNotFound, "not found")
	list, err = svc.ListAccessRequests(adminA, &loopsv1.ListAccessRequestsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRequests(), 2)

	// Isolation: a member cannot grant; the admin of B neither sees nor grants A's request.
	_, err = svc.GrantAccessRequest(alice, &loopsv1.GrantAccessRequestRequest{Id: r.GetId()})
	requireCode(t, err, connect.CodePermissionDenied, "needs a workspace admin key")
	_, err = svc.DenyAccessRequest(bob, &loopsv1.DenyAccessRequestRequest{Id: r.GetId(), Reason: "no"})
	requireCode(t, err, connect.CodePermissionDenied, "needs a workspace admin key")
	list, err = svc.ListAccessRequests(adminB, &loopsv1.ListAccessRequestsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetRequests())
	_, err = svc.ListAccessRequests(adminB, &loopsv1.ListAccessRequestsRequest{Workspace: "team-a"})
	requireCode(t, err, connect.CodeNotFound, `workspace "team-a" not found`)
	_, err = svc.GetAccessRequest(adminB, &loopsv1.GetAccessRequestRequest{Id: r.GetId()})
	requireCode(t, err, connect.CodeNotFound, "not found")
	_, err = svc.GrantAccessRequest(adminB, &loopsv1.GrantAccessRequestRequest{Id: r.GetId()})
	requireCode(t, err, connect.CodeNotFound, "not found")
	_, err = svc.ListWebhookDeliveries(alice, &loopsv1.ListWebhookDeliveriesRequest{})
	requireCode(t, err, connect.CodePermissionDenied, "needs a workspace admin key")

	// A grant beyond the catalog is refused with the maximum; another model is refused.
	_, err = svc.GrantAccessRequest(adminA, &loopsv1.GrantAccessRequestRequest{Id: r.GetId(), Amounts: &loopsv1.AccessAmounts{Model: "big", MaxLoraRank: 256}})
	requireCode(t, err, connect.CodeInvalidArgument, "max_lora_rank 256 is more than big serves: the maximum is 128")
	_, err = svc.GrantAccessRequest(adminA, &loopsv1.GrantAccessRequestRequest{Id: r.GetId(), Amounts: &loopsv1.AccessAmounts{Model: "small"}})
	requireCode(t, err, connect.CodeInvalidArgument, "a grant is for the model asked for")

	require.Error(t, e.pol.AllowModel("team-a", "big"))
	g, err := svc.GrantAccessRequest(adminA, &loopsv1.GrantAccessRequestRequest{Id: r.GetId(),
		Amounts: &loopsv1.AccessAmounts{Model: "big", MaxSequenceLength: 1024, MaxConcurrentRuns: 2}, Reason: "1K is enough"})
	require.NoError(t, err)
	require.Equal(t, loopsv1.AccessState_ACCESS_STATE_GRANTED, g.GetState())
	require.Equal(t, "key-admin-a", g.GetDecidedBy())
	require.JSONEq(t, `{"model":"big","allowed":false,"max_sequence_length":128,"max_lora_rank":8,"max_concurrent_runs":1}`, g.GetPolicyBefore())
	require.JSONEq(t, `{"model":"big","allowed":true,"max_sequence_length":1024,"max_lora_rank":8,"max_concurrent_runs":2}`, g.GetPolicyAfter())
	require.NoError(t, e.pol.AllowModel("team-a", "big"))
	require.Error(t, e.pol.AllowModel("team-b", "big"), "team-b's policy is untouched")
	require.Equal(t, 2, e.pol.Limits("team-a").MaxConcurrentRuns)
	_, err = svc.GrantAccessRequest(adminA, &loopsv1.GrantAccessRequestRequest{Id: r.GetId()})
	requireCode(t, err, connect.CodeFailedPrecondition, "is granted already")

	events, err := e.st.ListAuditEvents(t.Context(), "team-a", store.AuditQuery{Action: "workspace_policy_change"})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, "key-admin-a", events[0].KeyID)
	require.Equal(t, r.GetId(), events[0].Target)

	// A denial carries the reason the member sees.
	bobs, err := svc.ListAccessRequests(bob, &loopsv1.ListAccessRequestsRequest{})
	require.NoError(t, err)
	_, err = svc.DenyAccessRequest(adminA, &loopsv1.DenyAccessRequestRequest{Id: bobs.GetRequests()[0].GetId()})
	requireCode(t, err, connect.CodeInvalidArgument, "reason is required")
	_, err = svc.DenyAccessRequest(adminA, &loopsv1.DenyAccessRequestRequest{Id: bobs.GetRequests()[0].GetId(), Reason: "use 128"})
	require.NoError(t, err)
	seen, err := svc.GetAccessRequest(bob, &loopsv1.GetAccessRequestRequest{Id: bobs.GetRequests()[0].GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.AccessState_ACCESS_STATE_DENIED, seen.GetState())
	require.Equal(t, "use 128", seen.GetDecisionReason())

	// Pending requests are bounded per workspace (3 here).
	for i, key := range []string{"k1", "k2", "k3"} {
		_, err = svc.RequestAccess(member(t, "team-a", key), ask("big", int32(100+i)))
		require.NoError(t, err)
	}
	_, err = svc.RequestAccess(member(t, "team-a", "k4"), ask("big", 10))
	requireCode(t, err, connect.CodeResourceExhausted, `workspace "team-a" has 3 access requests pending, its limit`)
	_, err = svc.RequestAccess(member(t, "team-b", "k4"), ask("big", 10))
	require.NoError(t, err, "the bound is per workspace")

	// An operator names the workspace; a workspace key cannot request as an operator.
	op := auth.WithOperator(t.Context())
	_, err = svc.ListAccessRequests(op, &loopsv1.ListAccessRequestsRequest{})
	requireCode(t, err, connect.CodeInvalidArgument, "names the workspace")
	list, err = svc.ListAccessRequests(op, &loopsv1.ListAccessRequestsRequest{Workspace: "team-b"})
	require.NoError(t, err)
	require.Len(t, list.GetRequests(), 1)
}

// TestExpiringGrantRevertsAcrossRestart: a grant with a duration applies until its expiry
// on the injected clock, survives a restart of the service (it is read back from the
// store), and the sweep records it as expired, with its audit event.
func TestExpiringGrantRevertsAcrossRestart(t *testing.T) {
	e := newEnv(t, access.WebhookOptions{})
	r, err := e.svc.RequestAccess(member(t, "team-a", "key-alice"), ask("big", 512))
	require.NoError(t, err)
	_, err = e.svc.GrantAccessRequest(admin(t, "team-a", "key-admin"), &loopsv1.GrantAccessRequestRequest{Id: r.GetId(), DurationSeconds: 3600})
	require.NoError(t, err)
	require.NoError(t, e.pol.AllowModel("team-a", "big"))

	e.open(t, access.WebhookOptions{}) // a restart: a new policy and service on the same store
	require.NoError(t, e.pol.AllowModel("team-a", "big"), "the grant is read back")
	e.clk.Add(59 * time.Minute)
	e.svc.Sweep(t.Context())
	require.NoError(t, e.pol.AllowModel("team-a", "big"))

	e.clk.Add(time.Minute)
	require.Error(t, e.pol.AllowModel("team-a", "big"), "it stops applying at its expiry, sweep or not")
	e.svc.Sweep(t.Context())
	got, err := e.svc.GetAccessRequest(admin(t, "team-a", "key-admin"), &loopsv1.GetAccessRequestRequest{Id: r.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.AccessState_ACCESS_STATE_EXPIRED, got.GetState())
	events, err := e.st.ListAuditEvents(t.Context(), "team-a", store.AuditQuery{Action: "workspace_policy_revert"})
	require.NoError(t, err)
	require.Len(t, events, 1)
	e.open(t, access.WebhookOptions{})
	require.Error(t, e.pol.AllowModel("team-a", "big"), "an expired grant stays reverted after a restart")
}

// receiver is a loopback webhook receiver that can be stopped and started again on the
// same address.
type receiver struct {
	mu   sync.Mutex
	addr string
	srv  *http.Server
	got  map[string]map[string]any // by event id (dedupe)
	n    int                       // requests received, duplicates included
	bad  int                       // bad signatures
}

func (r *receiver) start(t *testing.T, secret []byte) {
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.n++
		if !access.Verify(secret, body, req.Header.Get(access.HeaderSignature)) {
			r.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev map[string]any
		_ = json.Unmarshal(body, &ev)
		require.Equal(t, req.Header.Get(access.HeaderEventID), ev["id"])
		r.got[ev["id"].(string)] = ev
	})}
	go func() { _ = r.srv.Serve(ln) }()
}

func (r *receiver) stop() { _ = r.srv.Close() }

func (r *receiver) events() map[string]map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]any{}
	for k, v := range r.got {
		out[k] = v
	}
	return out
}

// TestWebhookSignedAndLosesNothingAcrossReceiverRestart: every request and decision goes to
// a loopback receiver signed with HMAC-SHA256; while the receiver is down deliveries fail
// (visible to admins) and are retried with backoff; once it is back every event arrives,
// and a restart of the gateway in between loses none either.
func TestWebhookSignedAndLosesNothingAcrossReceiverRestart(t *testing.T) {
	secret := []byte("webhook-secret")
	rcv := &receiver{got: map[string]map[string]any{}}
	rcv.start(t, secret)
	t.Cleanup(rcv.stop)
	hook := access.WebhookOptions{URL: "http://" + rcv.addr + "/hook", Secret: secret, Backoff: time.Second, MaxBackoff: 4 * time.Second}
	e := newEnv(t, hook)
	alice, adm := member(t, "team-a", "key-alice"), admin(t, "team-a", "key-admin")

	r, err := e.svc.RequestAccess(alice, ask("big", 512))
	require.NoError(t, err)
	e.svc.Sweep(t.Context())
	require.Len(t, rcv.events(), 1)

	rcv.stop() // the receiver goes down
	_, err = e.svc.GrantAccessRequest(adm, &loopsv1.GrantAccessRequestRequest{Id: r.GetId(), DurationSeconds: 60})
	require.NoError(t, err)
	r2, err := e.svc.RequestAccess(member(t, "team-a", "key-bob"), ask("small", 256))
	require.NoError(t, err)
	_, err = e.svc.DenyAccessRequest(adm, &loopsv1.DenyAccessRequestRequest{Id: r2.GetId(), Reason: "no"})
	require.NoError(t, err)
	e.svc.Sweep(t.Context())
	ds, err := e.svc.ListWebhookDeliveries(adm, &loopsv1.ListWebhookDeliveriesRequest{})
	require.NoError(t, err)
	failing := 0
	for _, d := range ds.GetDeliveries() {
		if d.GetState() == store.WebhookPending && d.GetLastError() != "" {
			failing++
			require.Equal(t, int32(1), d.GetAttempts())
		}
	}
	require.Equal(t, 3, failing, "the admin sees the failing deliveries: %v", ds.GetDeliveries())

	e.open(t, hook) // the gateway restarts too, meanwhile
	e.clk.Add(61 * time.Second)
	e.svc.Sweep(t.Context()) // the grant expires: one more event, still undelivered
	rcv.start(t, secret)     // the receiver is back, on the same address
	e.clk.Add(10 * time.Second)
	e.svc.Sweep(t.Context())

	got := rcv.events()
	types := map[string]int{}
	for _, ev := range got {
		types[ev["type"].(string)]++
		require.Equal(t, "team-a", ev["workspace"])
	}
	require.Equal(t, map[string]int{"access_request.created": 2, "access_request.granted": 1, "access_request.denied": 1, "access_request.expired": 1}, types)
	require.Zero(t, rcv.bad)
	ds, err = e.svc.ListWebhookDeliveries(adm, &loopsv1.ListWebhookDeliveriesRequest{})
	require.NoError(t, err)
	for _, d := range ds.GetDeliveries() {
		require.Equal(t, store.WebhookDelivered, d.GetState(), d.GetId())
	}
	_, err = e.svc.ListWebhookDeliveries(admin(t, "team-b", "key-b"), &loopsv1.ListWebhookDeliveriesRequest{})
	require.NoError(t, err)
}

// TestWebhookURLIsOperatorOnly: no loops.v1 call takes a webhook URL (it is the operator's
// flag, never a tenant's setting), and nothing an admin reads back shows it.
func TestWebhookURLIsOperatorOnly(t *testing.T) {
	var walk func(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool)
	walk = func(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			name := strings.ToLower(string(f.Name()))
			require.False(t, strings.Contains(name, "webhook") || strings.Contains(name, "url") || strings.Contains(name, "secret"),
				"%s.%s: a tenant-settable webhook field", md.FullName(), f.Name())
			if f.Message() != nil {
				walk(f.Message(), seen)
			}
		}
	}
	services := loopsv1.File_loops_v1_access_proto.Services()
	for i := range services.Len() {
		methods := services.Get(i).Methods()
		for j := range methods.Len() {
			walk(methods.Get(j).Input(), map[protoreflect.FullName]bool{})
		}
	}
	d := (&loopsv1.WebhookDelivery{}).ProtoReflect().Descriptor()
	for i := range d.Fields().Len() {
		require.NotContains(t, strings.ToLower(string(d.Fields().Get(i).Name())), "url", "a delivery never shows the webhook's URL")
	}
}

// TestGrantFullFinetune: full fine-tuning (LoRA rank 0) is asked for and granted on one
// model like the other amounts; refused on a model whose backend does not serve it; the grant
// lets the workspace start rank-0 runs on that model, and survives a restart (it is stored
// with the request).
func TestGrantFullFinetune(t *testing.T) {
	e := newEnv(t, access.WebhookOptions{})
	alice, adminA := member(t, "team-a", "key-alice"), admin(t, "team-a", "key-admin-a")
	full := func(model string) *loopsv1.RequestAccessRequest {
		return &loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: model, FullFinetune: true}, Reason: "full fine-tune"}
	}
	_, err := e.svc.RequestAccess(alice, full("big"))
	requireCode(t, err, connect.CodeInvalidArgument, "full_finetune: the backend serving big does not do full fine-tuning (LoRA rank 0)")
	err = e.pol.StartRun("team-a", "run-0", "small", 0)
	requireCode(t, err, connect.CodePermissionDenied, "loops access request --model small --full-finetune --reason")
	r, err := e.svc.RequestAccess(alice, full("small"))
	require.NoError(t, err)
	g, err := e.svc.GrantAccessRequest(adminA, &loopsv1.GrantAccessRequestRequest{Id: r.GetId()})
	require.NoError(t, err)
	require.True(t, g.GetGranted().GetFullFinetune())
	require.Contains(t, g.GetPolicyAfter(), `"full_finetune":true`)
	require.NotContains(t, g.GetPolicyBefore(), "full_finetune")
	require.NoError(t, e.pol.StartRun("team-a", "run-1", "small", 0))
	e.pol.EndRun("run-1")
	e.open(t, access.WebhookOptions{}) // a restart: the grants are reloaded from the store
	require.NoError(t, e.pol.StartRun("team-a", "run-2", "small", 0))
	require.Error(t, e.pol.StartRun("team-b", "run-3", "small", 0), "another workspace is not granted")
}
