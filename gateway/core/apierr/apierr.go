package apierr

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/errs"
)

// InvalidArgument is a request the client must change: the message says what was wrong
// and how to fix it.
func InvalidArgument(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// FailedPrecondition is a request the state it names does not allow (yet).
func FailedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

// NotFound is a request for something that does not exist (or that the caller may not see).
func NotFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

// ResourceExhausted is a request over a limit: the message names the limit.
func ResourceExhausted(format string, args ...any) error {
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(format, args...))
}

// Unavailable is a request the server cannot serve now; clients retry it.
func Unavailable(format string, args ...any) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf(format, args...))
}

// Internal wraps an unexpected error while doing what. Its text (a driver's, a path) is for
// the log only: every edge masks an Internal error (see the package comment).
//
// A write the store refused because another gateway took the leader lease (store.ErrFenced)
// is Unavailable with reason NO_LEADER, which clients retry.
//
// An error that is the request's own context ending (the client went away, or its deadline
// passed while a store call ran) is not the server's failure: it is Canceled or
// DeadlineExceeded, logged as neither an internal error nor with an error id.
func Internal(what string, err error) error {
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
