package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/tokenstream"
)

// TestTopLogprobsOneKeyPerText: byte tokens that are not valid UTF-8 alone all read as
// "\ufffd" in JSON; the legacy top_logprobs object keeps one key per text as JSON writes it,
// with the most likely alternative's logprob (alternatives come most likely first).
func TestTopLogprobsOneKeyPerText(t *testing.T) {
	texts := map[int32]string{1: "\xe2", 2: "a", 3: "\xe3", 4: "\xe2\x80", 5: "\ufffd", 6: "b\xff"}
	alts := []tokenstream.Alt{{ID: 1, Logprob: -0.5}, {ID: 2, Logprob: -1}, {ID: 3, Logprob: -1.5}, {ID: 4, Logprob: -2}, {ID: 5, Logprob: -2.5}, {ID: 6, Logprob: -3}}
	m := topLogprobsOf(func(id int32) string { return texts[id] }, alts)
	require.Equal(t, map[string]float32{"\ufffd": -0.5, "a": -1, "\ufffd\ufffd": -2, "b\ufffd": -3}, m)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	var back map[string]float32
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, m, back, "no key collides once written")
}

// FuzzJSONText: jsonText is the text encoding/json writes for a string, key or value (as a
// parser reads it back).
func FuzzJSONText(f *testing.F) {
	for _, s := range []string{"", "a", "\xe2", "\xe2\x80", "\xe2\x80\xa6", "\xff\xfe", "é\x80x", "\ufffd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := json.Marshal(map[string]string{s: s})
		require.NoError(t, err)
		var back map[string]string
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, map[string]string{jsonText(s): jsonText(s)}, back)
	})
}
