package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func accessRequest(id, ws, by, model string, created time.Duration) *loopsv1.AccessRequest {
	return &loopsv1.AccessRequest{
		Id: id, Workspace: ws, RequestedBy: by, Reason: "need " + model,
		Requested: &loopsv1.AccessAmounts{Model: model, MaxSequenceLength: 64},
		State:     loopsv1.AccessState_ACCESS_STATE_PENDING, CreateTime: ts(created), UpdateTime: ts(created),
	}
}

func hookFor(id, ws string) *store.WebhookEvent {
	return &store.WebhookEvent{Workspace: ws, Body: []byte(`{"id":"` + id + `"}`), Delivery: &loopsv1.WebhookDelivery{
		Id: id, Event: "access_request.created", State: store.WebhookPending, CreateTime: ts(0), NextAttemptTime: ts(0)}}
}

// testAccessRequests: one pending request per workspace, key and model (a second replaces
// it, keeping its id); a bound on a workspace's pending requests; transitions that write the
// request, its audit event and webhook together, and refuse a request no longer in the state
// they start from; granted requests are listed for every workspace.
func testAccessRequests(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	_, err := st.GetAccessRequest(ctx, wsA, "acr-none")
	requireNotFound(t, err)

	r1 := accessRequest("acr-1", wsA, "key-a", "m1", 0)
	got, created, err := st.PutAccessRequest(ctx, r1, 2, hookFor("evt-1", wsA))
	require.NoError(t, err)
	require.True(t, created)
	requireProtoEqual(t, r1, got)

	again := accessRequest("acr-2", wsA, "key-a", "m1", time.Second)
	again.Reason = "changed my mind"
	got, created, err = st.PutAccessRequest(ctx, again, 2, hookFor("evt-2", wsA))
	require.NoError(t, err)
	require.False(t, created, "the same key and model update the pending request")
	require.Equal(t, "acr-1", got.GetId())
	require.Equal(t, r1.GetCreateTime().AsTime(), got.GetCreateTime().AsTime())
	stored, err := st.GetAccessRequest(ctx, wsA, "acr-1")
	require.NoError(t, err)
	require.Equal(t, "changed my mind", stored.GetReason())

	r3 := accessRequest("acr-3", wsA, "key-b", "m1", 2*time.Second)
	_, _, err = st.PutAccessRequest(ctx, r3, 2, nil)
	require.NoError(t, err)
	_, _, err = st.PutAccessRequest(ctx, accessRequest("acr-4", wsA, "key-c", "m1", 3*time.Second), 2, nil)
	require.ErrorIs(t, err, store.ErrLimit, "two pending requests is the bound")
	_, _, err = st.PutAccessRequest(ctx, accessRequest("acr-b", wsB, "key-c", "m1", 3*time.Second), 2, nil)
	require.NoError(t, err, "the bound is per workspace")

	// Another workspace's request is not found.
	_, err = st.GetAccessRequest(ctx, wsB, "acr-1")
	requireNotFound(t, err)
	list, err := st.ListAccessRequests(ctx, wsA, store.AccessQuery{})
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "acr-3", list[0].GetId())
	list, err = st.ListAccessRequests(ctx, wsA, store.AccessQuery{RequestedBy: "key-a"})
	require.NoError(t, err)
	require.Len(t, list, 1)

	ev := store.OwnedAuditEvent{Workspace: wsA, Event: store.AuditEvent{Time: base, KeyID: "key-admin",
		Surface: "access", Action: "grant", Event: "workspace_policy_change", Resource: "workspace_policy", Target: "acr-1", Status: 200, Code: "ok"}}
	granted := stored
	granted.State = loopsv1.AccessState_ACCESS_STATE_GRANTED
	granted.ExpireTime = ts(time.Hour)
	require.NoError(t, st.TransitionAccessRequest(ctx, granted, loopsv1.AccessState_ACCESS_STATE_PENDING, ev, hookFor("evt-3", wsA)))
	err = st.TransitionAccessRequest(ctx, granted, loopsv1.AccessState_ACCESS_STATE_PENDING, ev, hookFor("evt-4", wsA))
	require.ErrorIs(t, err, store.ErrConflict, "a decided request cannot be decided again")
	wrong := accessRequest("acr-1", wsB, "key-a", "m1", 0)
	requireNotFound(t, st.TransitionAccessRequest(ctx, wrong, loopsv1.AccessState_ACCESS_STATE_PENDING, ev, nil))

	events, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{})
	require.NoError(t, err)
	require.Len(t, events, 1, "the refused transition wrote no audit event")
	require.Equal(t, "workspace_policy_change", events[0].Event)
	hooks, err := st.ListWebhookDeliveries(ctx, wsA, 0)
	require.NoError(t, err)
	require.Len(t, hooks, 2, "evt-1 and evt-3 (evt-2 updated a request; evt-4 was rolled back)")

	all, err := st.GrantedAccessRequests(ctx)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.AccessRequest{granted}, all)
	// A granted request frees its pending slot.
	_, created, err = st.PutAccessRequest(ctx, accessRequest("acr-5", wsA, "key-a", "m1", 4*time.Second), 2, nil)
	require.NoError(t, err)
	require.True(t, created)
}

// testWebhookDeliveries: due deliveries oldest first, their state updated, pending counted.
func testWebhookDeliveries(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	for i, id := range []string{"evt-a", "evt-b"} {
		r := accessRequest("acr-"+id, wsA, "key-"+id, "m", time.Duration(i)*time.Second)
		h := hookFor(id, wsA)
		h.Delivery.NextAttemptTime = ts(time.Duration(i) * time.Minute)
		_, _, err := st.PutAccessRequest(ctx, r, 10, h)
		require.NoError(t, err)
	}
	due, err := st.DueWebhookDeliveries(ctx, base, 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Equal(t, "evt-a", due[0].Delivery.GetId())
	require.Equal(t, wsA, due[0].Workspace)
	require.JSONEq(t, `{"id":"evt-a"}`, string(due[0].Body))
	n, err := st.CountPendingWebhookDeliveries(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	d := due[0].Delivery
	d.State, d.Attempts, d.DeliveredTime = store.WebhookDelivered, 1, ts(time.Second)
	require.NoError(t, st.UpdateWebhookDelivery(ctx, d))
	due, err = st.DueWebhookDeliveries(ctx, base.Add(time.Hour), 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Equal(t, "evt-b", due[0].Delivery.GetId())
	list, err := st.ListWebhookDeliveries(ctx, wsA, 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, store.WebhookDelivered, list[1].GetState())
	list, err = st.ListWebhookDeliveries(ctx, wsB, 10)
	require.NoError(t, err)
	require.Empty(t, list)
	requireNotFound(t, st.UpdateWebhookDelivery(ctx, &loopsv1.WebhookDelivery{Id: "evt-none"}))
}
