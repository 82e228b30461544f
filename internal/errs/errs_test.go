package errs_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/loops-dev/loops/internal/errs"
)

// sdkRetries is the Tinker SDK's (stainless) transport retry rule.
func sdkRetries(status int) bool {
	return status == 408 || status == 409 || status == 429 || status >= 500
}

func TestTable(t *testing.T) {
	require.Len(t, errs.Codes(), 16)
	for _, code := range errs.Codes() {
		e := errs.Lookup(code)
		require.Equal(t, code, e.Code)
		// loops.v1 REST uses the standard table, exactly as grpc-gateway would.
		require.Equal(t, runtime.HTTPStatusFromCode(codes.Code(code)), e.HTTPStatus, code.String())
		// On Tinker routes the SDK retries exactly the retryable codes, never a user error.
		require.Equal(t, e.Retryable, sdkRetries(e.TinkerStatus), code.String())
		if e.Category == errs.User {
			require.False(t, e.Retryable, code.String())
			require.Less(t, e.TinkerStatus, 500, code.String())
		}
		require.NotEmpty(t, e.Reason)
	}
	require.Equal(t, 404, errs.Lookup(connect.CodeUnimplemented).TinkerStatus)
	require.Equal(t, 400, errs.Lookup(connect.CodeAlreadyExists).TinkerStatus)
	require.Equal(t, connect.CodeUnknown, errs.Lookup(connect.Code(99)).Code)
	require.Equal(t, "INVALID_ARGUMENT", errs.Lookup(connect.CodeInvalidArgument).Reason)
}

func TestEdgeMasksInternal(t *testing.T) {
	out := errs.Edge(connect.NewError(connect.CodeInternal, errors.New("sqlite: disk I/O error at /data/loops.db")))
	require.NotEmpty(t, out.ID)
	require.Equal(t, connect.CodeInternal, out.Err.Code())
	require.Equal(t, "internal error, id "+out.ID, out.Err.Message())
	info := errs.Info(out.Err)
	require.NotNil(t, info)
	require.Equal(t, "INTERNAL", info.GetReason())
	require.Equal(t, errs.Domain, info.GetDomain())
	require.Equal(t, out.ID, info.GetMetadata()[errs.MetadataErrorID])

	// An error that passed an edge, or an Incident, is not masked again.
	again := errs.Edge(out.Err)
	require.Empty(t, again.ID)
	require.Equal(t, out.Err.Message(), again.Err.Message())
	inc := errs.Edge(errs.Incident("abc", "the backend failed (incident abc)"))
	require.Empty(t, inc.ID)
	require.Equal(t, "the backend failed (incident abc)", inc.Err.Message())

	// A plain error is Unknown and masked.
	plain := errs.Edge(errors.New("driver text"))
	require.Equal(t, connect.CodeUnknown, plain.Err.Code())
	require.NotContains(t, plain.Err.Message(), "driver")
}

func TestEdgeReasons(t *testing.T) {
	src := connect.NewError(connect.CodeNotFound, errors.New("run r1 not found"))
	out := errs.Edge(src)
	require.Empty(t, out.ID)
	require.Equal(t, "run r1 not found", out.Err.Message())
	require.Equal(t, "NOT_FOUND", errs.Reason(out.Err))
	require.Nil(t, errs.Info(src), "Edge must not mutate its input")

	fine := errs.Edge(errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, errors.New("queue full")))
	require.Equal(t, errs.ReasonQueueFull, errs.Reason(fine.Err))
	require.Len(t, fine.Err.Details(), 1)
}

func TestClientGone(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	require.False(t, errs.ClientGone(ctx))
	cancel()
	require.True(t, errs.ClientGone(ctx))
	dl, cancel2 := context.WithTimeout(t.Context(), 0)
	defer cancel2()
	<-dl.Done()
	require.False(t, errs.ClientGone(dl))
}
