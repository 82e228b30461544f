package auth

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseKeysRefusesUnsafeWorkspaceNames(t *testing.T) {
	for _, ws := range []string{"../../escape", "..", ".", "a/b", `a\b`, "-flag", "a b", "ws.1", "é", strings.Repeat("a", 65)} {
		_, err := ParseKeys([]string{"tml-secret=" + ws})
		require.Error(t, err, ws)
		require.ErrorContains(t, err, "is not allowed", ws)
		require.NotContains(t, err.Error(), "tml-secret", "the key itself is never shown")
	}
	for _, ws := range []string{"team-a", "A_1", "x", strings.Repeat("a", 64)} {
		k, err := ParseKeys([]string{"tml-secret=" + ws})
		require.NoError(t, err, ws)
		got, err := k.Authenticate("tml-secret")
		require.NoError(t, err)
		require.Equal(t, ws, got)
	}
	// Derived workspaces (keys without one) are valid names.
	k, err := ParseKeys([]string{"tml-secret"})
	require.NoError(t, err)
	got, err := k.Authenticate("tml-secret")
	require.NoError(t, err)
	require.NoError(t, ValidateWorkspaceName(got))
}
