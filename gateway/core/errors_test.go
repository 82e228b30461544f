package core

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/errs"
)

// TestOperationErrorUsesTheOneTable: every code's category on a failed operation is the
// table's (internal/errs, also used by compat and the gateway), and a masked code is stored
// as "internal error, id <id>" with the id returned for the log, never the driver's text.
func TestOperationErrorUsesTheOneTable(t *testing.T) {
	for _, code := range errs.Codes() {
		e := errs.Lookup(code)
		oe, id := operationError(connect.NewError(code, errors.New("sqlite: database disk image is malformed")))
		require.EqualValues(t, code, oe.GetCode(), code.String())
		require.Equal(t, e.Category.Proto(), oe.GetCategory(), code.String())
		if e.Masked {
			require.NotEmpty(t, id, code.String())
			require.Equal(t, "internal error, id "+id, oe.GetMessage())
		} else {
			require.Empty(t, id, code.String())
			require.Equal(t, "sqlite: database disk image is malformed", oe.GetMessage())
		}
	}
	// A store failure from internal() is masked.
	oe, id := operationError(internal("recording operation", errors.New("SQLITE_BUSY at /data/loops.db")))
	require.NotContains(t, oe.GetMessage(), "/data")
	require.Contains(t, oe.GetMessage(), id)
	// A plain error (no code) is Unknown: the server's, masked.
	oe, id = operationError(errors.New("boom"))
	require.EqualValues(t, connect.CodeUnknown, oe.GetCode())
	require.NotEmpty(t, id)
}
