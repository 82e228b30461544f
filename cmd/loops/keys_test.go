package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	sheet := filepath.Join(t.TempDir(), "prices.yaml")
	require.NoError(t, os.WriteFile(sheet, []byte("models:\n  loops/tiny: {train: \"0.40\"}\n"), 0o600))
	url, _ := startServe(t, t.TempDir(), "--api-key", flagKey+"=flag-ws", "--operator-key", opKey, "--prices", sheet)
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

	// Budgets: set at creation, shown, changed by an admin (0 removes one, a flag left out
	// keeps it), refused from a member.
	_, err = keys(admin, "create", "--name", "capped", "--budget-usd-month", "1.1234567")
	require.ErrorContains(t, err, "budget_usd_month")
	out, err = keys(admin, "create", "--name", "capped", "--budget-usd-month", "25.50", "--budget-usd-total", "100")
	require.NoError(t, err, out)
	capped := secretOf(out)
	out, err = keys(capped, "whoami", "--json")
	require.NoError(t, err, out)
	require.NoError(t, protojson.Unmarshal([]byte(out), &who))
	out, err = keys(admin, "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "SPENT/BUDGET MONTH")
	require.Contains(t, out, "0/25.5 USD")
	require.Contains(t, out, "0/100 USD")
	out, err = keys(admin, "update", who.GetKeyId(), "--budget-usd-total", "0")
	require.NoError(t, err, out)
	month := time.Now().UTC().Format("2006-01")
	require.Contains(t, out, "budget/month: 25.5 USD: 0 of 25.5 USD spent in "+month+", 0 running")
	require.Contains(t, out, "budget total: -")
	out, err = keys(admin, "show", who.GetKeyId())
	require.NoError(t, err, out)
	require.Contains(t, out, "budget/month: 25.5 USD: 0 of 25.5 USD spent in "+month+", 0 running")
	_, err = keys(capped, "update", who.GetKeyId(), "--budget-usd-month", "1000")
	require.ErrorContains(t, err, "admin key")
}
