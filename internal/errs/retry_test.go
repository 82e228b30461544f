package errs_test

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/errs"
)

func TestRetryAfter(t *testing.T) {
	err := errs.Limit(connect.CodeResourceExhausted, errs.ReasonQueueFull, "max_pending_per_run", 2500*time.Millisecond, errors.New("full"))
	d, ok := errs.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, 2500*time.Millisecond, d)
	require.Equal(t, "3", errs.RetryAfterValue(d), "rounded up to whole seconds")
	require.Equal(t, "max_pending_per_run", errs.Info(err).GetMetadata()[errs.MetadataLimit])
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(err))

	// The edge's copy carries the header and the same details; the original is unchanged.
	out := errs.WithRetryAfterHeader(errs.Edge(err).Err)
	require.Equal(t, "3", out.Meta().Get(errs.HeaderRetryAfter))
	require.Empty(t, err.Meta().Get(errs.HeaderRetryAfter))
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(out))

	// Any 429 gets the default; other codes get none.
	d, ok = errs.RetryAfter(connect.NewError(connect.CodeResourceExhausted, errors.New("busy")))
	require.True(t, ok)
	require.Equal(t, errs.DefaultRetryAfter, d)
	_, ok = errs.RetryAfter(connect.NewError(connect.CodeInvalidArgument, errors.New("bad")))
	require.False(t, ok)
	require.Equal(t, "1", errs.RetryAfterValue(0))
}
