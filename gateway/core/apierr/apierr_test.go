package apierr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/errs"
)

// TestStoreErrorsOfTheRequestOrTheLeaseAreNotInternal: a store call cut by the request's
// context, or refused because the lease was lost, is not an internal error.
func TestStoreErrorsOfTheRequestOrTheLeaseAreNotInternal(t *testing.T) {
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(Internal("x", fmt.Errorf("put: %w", context.Canceled))))
	require.Equal(t, connect.CodeDeadlineExceeded, connect.CodeOf(Internal("x", fmt.Errorf("put: %w", context.DeadlineExceeded))))
	fenced := Internal("x", fmt.Errorf("put: %w", store.ErrFenced))
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(fenced))
	require.Equal(t, errs.ReasonNoLeader, errs.Reason(fenced))
	disk := Internal("writing x", errors.New("disk full"))
	require.Equal(t, connect.CodeInternal, connect.CodeOf(disk))
	require.Equal(t, "writing x: disk full", errs.Message(disk))
}

// TestClientErrorsCarryTheirCodeAndMessage: each constructor's code, and its message
// formatted from its arguments.
func TestClientErrorsCarryTheirCodeAndMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		code connect.Code
	}{
		{InvalidArgument("bad %s %d", "x", 1), connect.CodeInvalidArgument},
		{FailedPrecondition("bad %s %d", "x", 1), connect.CodeFailedPrecondition},
		{NotFound("bad %s %d", "x", 1), connect.CodeNotFound},
		{ResourceExhausted("bad %s %d", "x", 1), connect.CodeResourceExhausted},
		{Unavailable("bad %s %d", "x", 1), connect.CodeUnavailable},
	} {
		require.Equal(t, c.code, connect.CodeOf(c.err))
		require.Equal(t, "bad x 1", errs.Message(c.err))
	}
}
