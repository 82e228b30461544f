package keysvc

import (
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/policy"
)

// FuzzKeyBudget: any budget string is either refused with InvalidArgument or kept in its
// canonical form, which reads back as itself and parses as a budget at least 0 ("" for none).
func FuzzKeyBudget(f *testing.F) {
	for _, s := range []string{"", "0", "0.000", "25.50", "100", "-1", "1.1234567", "1e3", " 1", "0.000001", "9223372", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := keyBudget("budget_usd_month", s)
		if err != nil {
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
			return
		}
		if out == "" {
			return
		}
		again, err := keyBudget("budget_usd_month", out)
		require.NoError(t, err)
		require.Equal(t, out, again)
		v, err := policy.ParseBudget(out)
		require.NoError(t, err)
		require.Positive(t, int64(v))
	})
}
