package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestKeysCommands drives loops keys create|list|revoke|whoami against loops serve with an
// operator key: the operator makes an admin key, the admin a member key and lists its
// workspace's keys (not another's), the member is refused key management, a revoked key is
// refused.
func TestKeysCommands(t *testing.T) {
	t.Setenv("LOOPS_OPERATOR_KEY", "")
	t.Setenv("LOOPS_API_KEY", "")
	const flagKey, opKey = "tml-cli-flag", "tml-cli-operator"
	url, _ := startServe(t, t.TempDir(), "--api-key", flagKey+"=flag-ws", "--operator-key", opKey)
	keys := func(key string, args ...string) (string, error) {
		return runCLI(t, append([]string{"keys", "--url", url, "--api-key", key}, args...)...)
	}
	secretOf := func(out string) string {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		s := lines[len(lines)-1]
		require.True(t, strings.HasPrefix(s, "tml-"), out)
		return s
	}

	_, err := keys(opKey, "create", "--role", "boss", "--workspace", "team")
	require.ErrorContains(t, err, "use member or admin")
	out, err := keys(opKey, "create", "--workspace", "team", "--role", "admin", "--name", "lead")
	require.NoError(t, err, out)
	require.Contains(t, out, "shown once")
	admin := secretOf(out)
	out, err = keys(admin, "create", "--name", "worker")
	require.NoError(t, err, out)
	member := secretOf(out)

	out, err = keys(admin, "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "lead")
	require.Contains(t, out, "worker")
	require.NotContains(t, out, member)
	_, err = keys(admin, "list", "--workspace", "flag-ws")
	require.ErrorContains(t, err, "not found")
	_, err = keys(member, "list")
	require.ErrorContains(t, err, "admin key")

	out, err = keys(member, "whoami", "--json")
	require.NoError(t, err, out)
	var who loopsv1.WhoAmIResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &who))
	require.Equal(t, "team", who.GetWorkspace())
	require.Equal(t, loopsv1.KeyRole_KEY_ROLE_MEMBER, who.GetRole())

	out, err = keys(opKey, "revoke", who.GetKeyId())
	require.NoError(t, err, out)
	require.Contains(t, out, "revoked "+who.GetKeyId())
	_, err = keys(member, "whoami")
	require.ErrorContains(t, err, "revoked")

	out, err = keys(opKey, "list", "--live", "--json")
	require.NoError(t, err, out)
	var live loopsv1.ListKeysResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &live))
	require.Len(t, live.GetKeys(), 1)
	require.Equal(t, "lead", live.GetKeys()[0].GetName())
}
