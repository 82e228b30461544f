package core

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

func invalidArgument(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

func failedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

func notFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

func resourceExhausted(format string, args ...any) error {
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(format, args...))
}

// internal wraps an unexpected error. Its text (a driver's, a path) is for the log only:
// every edge (the gateway's interceptor, compat, operationError) masks an Internal error to
// "internal error, id <id>" and logs the full error under that id (see internal/errs).
//
// A write the store refused because another gateway took the leader lease (store.ErrFenced)
// is Unavailable with reason NO_LEADER, which clients retry.
//
// An error that is the request's own context ending (the client went away, or its deadline
// passed while a store call ran) is not the server's failure: it is Canceled or
// DeadlineExceeded, logged as neither an internal error nor with an error id.
func internal(what string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, fmt.Errorf("%s: the request was cancelled", what))
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s: the request's deadline passed", what))
	case errors.Is(err, store.ErrFenced):
		return errs.New(connect.CodeUnavailable, errs.ReasonNoLeader, fmt.Errorf("%s: this gateway has lost the leader lease to another one; retry, and the leader serves you", what))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s: %w", what, err))
}

// storeErr maps a store error: ErrNotFound becomes NotFound with the given description.
func storeErr(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return notFound("%s not found (it does not exist, or belongs to another API key's workspace)", what)
	}
	return internal("store", err)
}

// operationError turns an error into the error recorded on a failed operation, with the
// category of the one error table (internal/errs). A masked code (Internal, Unknown,
// DataLoss) is recorded as "internal error, id <id>" and id is returned for the caller to
// log the full error under; id is empty otherwise.
func operationError(err error) (oe *loopsv1.OperationError, id string) {
	out := errs.Edge(err)
	return &loopsv1.OperationError{
		Code:     int32(out.Err.Code()),
		Message:  out.Err.Message(),
		Category: out.Entry.Category.Proto(),
	}, out.ID
}

func unavailable(format string, args ...any) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf(format, args...))
}
