package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func accessToken(id string, created, expires time.Duration) *loopsv1.WeightsAccessToken {
	return &loopsv1.WeightsAccessToken{
		Id: id, CheckpointPath: "tinker://run-1/weights/" + id, CreateTime: ts(created), ExpireTime: ts(expires),
		Description: "for " + id, CreatedBy: "key-0123456789abcdef",
	}
}

func hashOf(id string) string { return fmt.Sprintf("%064x", id) }

// testWeightsAccessTokens: create, find by hash (whatever the workspace), list a
// workspace's live tokens newest first, delete by id within the workspace only, delete the
// expired ones; a duplicate id or hash is refused.
func testWeightsAccessTokens(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	now := base.Add(time.Minute)
	_, _, err := st.GetWeightsAccessToken(ctx, hashOf("none"))
	requireNotFound(t, err)
	require.Error(t, st.CreateWeightsAccessToken(ctx, wsA, &loopsv1.WeightsAccessToken{}, hashOf("x"), now, 10), "a token needs an id and expire_time")
	require.Error(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-0", 0, time.Hour), "", now, 10), "a token needs a hash")

	t1 := accessToken("wat-1", 0, time.Hour)
	t2 := accessToken("wat-2", time.Second, 2*time.Hour)
	old := accessToken("wat-old", -time.Hour, time.Second) // expired at now
	for _, tk := range []*loopsv1.WeightsAccessToken{t1, t2, old} {
		require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, tk, hashOf(tk.GetId()), now, 10))
	}
	tb := accessToken("wat-b", 2*time.Second, time.Hour)
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsB, tb, hashOf("wat-b"), now, 10))

	got, ws, err := st.GetWeightsAccessToken(ctx, hashOf("wat-2"))
	require.NoError(t, err)
	require.Equal(t, wsA, ws)
	requireProtoEqual(t, t2, got)
	got, ws, err = st.GetWeightsAccessToken(ctx, hashOf("wat-old"))
	require.NoError(t, err, "an expired token is still found: the caller checks expire_time")
	require.Equal(t, wsA, ws)
	requireProtoEqual(t, old, got)

	list, err := st.ListWeightsAccessTokens(ctx, wsA, now)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.WeightsAccessToken{t2, t1}, list)
	list, err = st.ListWeightsAccessTokens(ctx, wsB, now)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.WeightsAccessToken{tb}, list)

	require.Error(t, st.CreateWeightsAccessToken(ctx, wsB, accessToken("wat-1", 0, time.Hour), hashOf("other"), now, 10), "wat-1 exists")
	require.Error(t, st.CreateWeightsAccessToken(ctx, wsB, accessToken("wat-3", 0, time.Hour), hashOf("wat-1"), now, 10), "the hash exists")
	_, ws, err = st.GetWeightsAccessToken(ctx, hashOf("wat-1"))
	require.NoError(t, err)
	require.Equal(t, wsA, ws)

	requireNotFound(t, st.DeleteWeightsAccessToken(ctx, wsB, "wat-1"))
	require.NoError(t, st.DeleteWeightsAccessToken(ctx, wsA, "wat-1"))
	_, _, err = st.GetWeightsAccessToken(ctx, hashOf("wat-1"))
	requireNotFound(t, err)
	requireNotFound(t, st.DeleteWeightsAccessToken(ctx, wsA, "wat-1"))

	n, err := st.DeleteExpiredWeightsAccessTokens(ctx, now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, _, err = st.GetWeightsAccessToken(ctx, hashOf("wat-old"))
	requireNotFound(t, err)
	_, _, err = st.GetWeightsAccessToken(ctx, hashOf("wat-2"))
	require.NoError(t, err)
}

// testWeightsAccessTokenLimit: a workspace holds at most max live tokens; expired ones
// and other workspaces' do not count, and a refused create writes nothing.
func testWeightsAccessTokenLimit(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	now := base.Add(time.Minute)
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-exp", 0, time.Second), hashOf("wat-exp"), now, 2))
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsB, accessToken("wat-b", 0, time.Hour), hashOf("wat-b"), now, 2))
	for i := range 2 {
		id := fmt.Sprintf("wat-%d", i)
		require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken(id, time.Duration(i)*time.Second, time.Hour), hashOf(id), now, 2))
	}
	err := st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-9", 0, time.Hour), hashOf("wat-9"), now, 2)
	require.ErrorIs(t, err, store.ErrLimit)
	_, _, err = st.GetWeightsAccessToken(ctx, hashOf("wat-9"))
	requireNotFound(t, err)
	// Later, the live ones have expired: there is room again.
	later := base.Add(2 * time.Hour)
	require.NoError(t, st.CreateWeightsAccessToken(ctx, wsA, accessToken("wat-9", time.Hour, 3*time.Hour), hashOf("wat-9"), later, 2))
}
