package infer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSafeLen: streamed text never shows part of a stop sequence nor half a character, and
// what it shows is a prefix of the final text.
func TestSafeLen(t *testing.T) {
	for _, c := range []struct {
		s    string
		stop []string
		want string
	}{
		{"hello", nil, "hello"},
		{"hello wor", []string{"world"}, "hello "},
		{"hello world and", []string{"world"}, "hello "},
		{"ab\n", []string{"\n\n"}, "ab"},
		{"abc", []string{"x", "cd"}, "ab"},
		{"caf\xc3", nil, "caf"},
		{"café\xf0\x9f", nil, "café"},
		{"a\xff\xfeb", nil, "a\xff\xfeb"}, // invalid bytes inside stay: they decode the same later
	} {
		require.Equal(t, c.want, c.s[:safeLen(c.s, c.stop)], "%q %q", c.s, c.stop)
	}
}
