package core

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/money"
)

// testPrices is a price sheet of the YAML sheet, loaded from a file of the test's.
func testPrices(t *testing.T, sheet string) *prices.Watcher {
	t.Helper()
	file := filepath.Join(t.TempDir(), "prices.yaml")
	require.NoError(t, os.WriteFile(file, []byte(sheet), 0o600))
	w, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return w
}

// poolStopsAudited is ws-a's pool_scale_to_zero audit events, as "pool: action".
func (h *harness) poolStopsAudited() []string {
	h.t.Helper()
	events, err := h.core.store.ListAuditEvents(h.ctx, "ws-a", store.AuditQuery{})
	require.NoError(h.t, err)
	var out []string
	for _, e := range events {
		if e.Event == "pool_scale_to_zero" {
			out = append(out, e.Target+": "+e.Action)
		}
	}
	return out
}

// testUSD is the amount s ("0.45") in USD.
func testUSD(t *testing.T, s string) money.USD {
	t.Helper()
	v, err := money.ParseUSD(s, money.Digits)
	require.NoError(t, err)
	return v
}
