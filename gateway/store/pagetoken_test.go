package store_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
)

func TestPageTokenRoundTrip(t *testing.T) {
	p := store.NewPageTokens(nil)
	for _, c := range []*store.Cursor{
		{CreateTime: time.Unix(1700000000, 123456789).UTC(), ID: "sess-1"},
		{CreateTime: time.Unix(0, 0).UTC(), TrainingRunID: "run-1", ID: "weights/step-10"},
		{CreateTime: time.Unix(-5, 7).UTC(), ID: ""},
	} {
		tok := p.Encode("ws", "checkpoints", c)
		require.NotContains(t, tok, "=")
		got, err := p.Decode("ws", "checkpoints", tok)
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	require.Empty(t, p.Encode("ws", "sessions", nil))
}

func TestPageTokenRefused(t *testing.T) {
	p := store.NewPageTokens([]byte("key"))
	c := &store.Cursor{CreateTime: time.Unix(100, 0), ID: "r1"}
	tok := p.Encode("ws-a", "training_runs", c)
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	require.NoError(t, err)
	flip := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}

	for name, tc := range map[string]struct {
		ws, list, token string
		p               *store.PageTokens
		want            string
	}{
		"empty":            {"ws-a", "training_runs", "", p, "empty"},
		"not base64":       {"ws-a", "training_runs", "a+b/", p, "base64url"},
		"padded":           {"ws-a", "training_runs", tok + "==", p, "base64url"},
		"too long":         {"ws-a", "training_runs", strings.Repeat("A", store.MaxPageTokenLen+1), p, "maximum"},
		"truncated":        {"ws-a", "training_runs", tok[:8], p, "truncated"},
		"version":          {"ws-a", "training_runs", flip(0), p, "version 0"},
		"other workspace":  {"ws-b", "training_runs", tok, p, "another workspace"},
		"other list":       {"ws-a", "sessions", tok, p, "issued for listing training_runs, not sessions"},
		"tampered id":      {"ws-a", "training_runs", flip(len(raw) - 17), p, "signature"},
		"tampered mac":     {"ws-a", "training_runs", flip(len(raw) - 1), p, "signature"},
		"tampered time":    {"ws-a", "training_runs", flip(1 + 8 + 1 + len("training_runs")), p, "signature"},
		"other server key": {"ws-a", "training_runs", tok, store.NewPageTokens(nil), "signature"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.p.Decode(tc.ws, tc.list, tc.token)
			require.ErrorIs(t, err, store.ErrBadPageToken)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzPageTokenDecode checks that Decode never panics, that whatever it accepts encodes back
// to the same token (a position has exactly one token), and that a token signed with another
// key is never accepted.
func FuzzPageTokenDecode(f *testing.F) {
	p := store.NewPageTokens([]byte("fuzz key"))
	f.Add(p.Encode("ws", "sessions", &store.Cursor{CreateTime: time.Unix(1, 2), ID: "s1"}))
	f.Add(p.Encode("ws", "sessions", &store.Cursor{CreateTime: time.Unix(-1, 0), TrainingRunID: "r", ID: "weights/x"}))
	f.Add("")
	f.Add("AQ")
	f.Add(strings.Repeat("_", 100))
	other := store.NewPageTokens([]byte("other key"))
	f.Fuzz(func(t *testing.T, token string) {
		c, err := p.Decode("ws", "sessions", token)
		if err != nil {
			require.ErrorIs(t, err, store.ErrBadPageToken)
			require.Nil(t, c)
			return
		}
		require.Equal(t, token, p.Encode("ws", "sessions", c))
		_, err = other.Decode("ws", "sessions", token)
		require.Error(t, err)
	})
}
