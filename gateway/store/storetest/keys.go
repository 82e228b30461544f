package storetest

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func apiKey(id, ws string, created time.Duration, role loopsv1.KeyRole) *loopsv1.ApiKey {
	return &loopsv1.ApiKey{Id: id, Workspace: ws, Role: role, Name: "ci " + id, CreateTime: ts(created)}
}

// testAPIKeys: create, find by hash and by id (scoped to a workspace or not), list newest
// first per workspace and for all, revoke once, touch forward only; duplicates refused.
func testAPIKeys(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	h1, h2, h3 := sha256.Sum256([]byte("tml-one")), sha256.Sum256([]byte("tml-two")), sha256.Sum256([]byte("tml-three"))
	_, err := st.APIKeyByHash(ctx, h1)
	requireNotFound(t, err)
	_, err = st.GetAPIKey(ctx, "", "key-1")
	requireNotFound(t, err)
	require.Error(t, st.CreateAPIKey(ctx, &loopsv1.ApiKey{Workspace: wsA}, h1), "a key needs an id")
	require.Error(t, st.CreateAPIKey(ctx, &loopsv1.ApiKey{Id: "key-x"}, h1), "a key needs a workspace")

	k1 := apiKey("key-1", wsA, 0, loopsv1.KeyRole_KEY_ROLE_MEMBER)
	k2 := apiKey("key-2", wsA, time.Second, loopsv1.KeyRole_KEY_ROLE_ADMIN)
	k3 := apiKey("key-3", wsB, 2*time.Second, loopsv1.KeyRole_KEY_ROLE_MEMBER)
	require.NoError(t, st.CreateAPIKey(ctx, k1, h1))
	require.NoError(t, st.CreateAPIKey(ctx, k2, h2))
	require.NoError(t, st.CreateAPIKey(ctx, k3, h3))
	require.Error(t, st.CreateAPIKey(ctx, apiKey("key-1", wsB, 0, loopsv1.KeyRole_KEY_ROLE_MEMBER), sha256.Sum256([]byte("tml-other"))), "an id that exists")
	require.Error(t, st.CreateAPIKey(ctx, apiKey("key-9", wsB, 0, loopsv1.KeyRole_KEY_ROLE_MEMBER), h1), "a hash that exists")

	got, err := st.APIKeyByHash(ctx, h2)
	require.NoError(t, err)
	requireProtoEqual(t, k2, got)
	got, err = st.GetAPIKey(ctx, wsB, "key-3")
	require.NoError(t, err)
	requireProtoEqual(t, k3, got)
	got, err = st.GetAPIKey(ctx, "", "key-3")
	require.NoError(t, err)
	requireProtoEqual(t, k3, got)
	_, err = st.GetAPIKey(ctx, wsA, "key-3")
	requireNotFound(t, err)

	list, err := st.ListAPIKeys(ctx, wsA, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"key-2", "key-1"}, keyIDs(list))
	list, err = st.ListAPIKeys(ctx, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"key-3", "key-2", "key-1"}, keyIDs(list))
	list, err = st.ListAPIKeys(ctx, "", 2)
	require.NoError(t, err)
	require.Equal(t, []string{"key-3", "key-2"}, keyIDs(list))
	list, err = st.ListAPIKeys(ctx, "ws-none", 0)
	require.NoError(t, err)
	require.Empty(t, list)

	// Revoke: another workspace's key is not found and stays live; a revoke happens once.
	at := base.Add(time.Hour)
	_, err = st.RevokeAPIKey(ctx, wsB, "key-1", at)
	requireNotFound(t, err)
	got, err = st.GetAPIKey(ctx, wsA, "key-1")
	require.NoError(t, err)
	require.Nil(t, got.GetRevokeTime())
	got, err = st.RevokeAPIKey(ctx, wsA, "key-1", at)
	require.NoError(t, err)
	require.Equal(t, at.UnixNano(), got.GetRevokeTime().AsTime().UnixNano())
	got, err = st.RevokeAPIKey(ctx, "", "key-1", at.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, at.UnixNano(), got.GetRevokeTime().AsTime().UnixNano(), "the first revoke time stays")
	got, err = st.APIKeyByHash(ctx, h1)
	require.NoError(t, err)
	require.NotNil(t, got.GetRevokeTime())
	_, err = st.RevokeAPIKey(ctx, "", "key-none", at)
	requireNotFound(t, err)

	// Touch moves last use forward, never back.
	require.NoError(t, st.TouchAPIKey(ctx, "key-2", at))
	require.NoError(t, st.TouchAPIKey(ctx, "key-2", at.Add(-time.Minute)))
	got, err = st.GetAPIKey(ctx, wsA, "key-2")
	require.NoError(t, err)
	require.Equal(t, timestamppb.New(at).AsTime(), got.GetLastUsedTime().AsTime())
	require.NoError(t, st.TouchAPIKey(ctx, "key-none", at))

	// Budgets: set in the workspace's key only, kept with its times, cleared with "".
	_, err = st.SetAPIKeyBudgets(ctx, wsB, "key-2", "5", "")
	requireNotFound(t, err)
	got, err = st.SetAPIKeyBudgets(ctx, wsA, "key-2", "12.5", "100")
	require.NoError(t, err)
	require.Equal(t, "12.5", got.GetBudgetUsdMonth())
	require.Equal(t, "100", got.GetBudgetUsdTotal())
	require.Equal(t, timestamppb.New(at).AsTime(), got.GetLastUsedTime().AsTime(), "the last use stays")
	got, err = st.APIKeyByHash(ctx, h2)
	require.NoError(t, err)
	require.Equal(t, "12.5", got.GetBudgetUsdMonth())
	got, err = st.SetAPIKeyBudgets(ctx, "", "key-2", "", "100")
	require.NoError(t, err)
	require.Empty(t, got.GetBudgetUsdMonth())
	require.Equal(t, "100", got.GetBudgetUsdTotal())
	got, err = st.SetAPIKeyBudgets(ctx, wsA, "key-1", "1", "")
	require.NoError(t, err)
	require.Equal(t, "1", got.GetBudgetUsdMonth())
	require.NotNil(t, got.GetRevokeTime(), "a revoked key stays revoked")
	_, err = st.SetAPIKeyBudgets(ctx, "", "key-none", "1", "")
	requireNotFound(t, err)
}

func keyIDs(keys []*loopsv1.ApiKey) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.GetId()
	}
	return out
}

// testSigningKeys: put, list since a time newest first, delete the old ones.
func testSigningKeys(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	none, err := st.SigningKeys(ctx, time.Time{})
	require.NoError(t, err)
	require.Empty(t, none)
	seed := func(b byte) []byte { s := make([]byte, 32); s[0] = b; return s }
	for i, id := range []string{"sk-1", "sk-2", "sk-3"} {
		require.NoError(t, st.PutSigningKey(ctx, store.SigningKey{ID: id, Created: base.Add(time.Duration(i) * time.Hour), Seed: seed(byte(i))}))
	}
	require.Error(t, st.PutSigningKey(ctx, store.SigningKey{ID: "sk-1", Created: base, Seed: seed(9)}), "an id that exists")
	got, err := st.SigningKeys(ctx, base.Add(time.Hour))
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "sk-3", got[0].ID)
	require.Equal(t, "sk-2", got[1].ID)
	require.Equal(t, seed(2), got[0].Seed)
	require.True(t, base.Add(2*time.Hour).Equal(got[0].Created))
	n, err := st.DeleteSigningKeys(ctx, base.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	got, err = st.SigningKeys(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, got, 1)
}
