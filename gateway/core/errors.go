package core

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
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

// internal wraps an unexpected error; the message says what failed without leaking details
// the client cannot act on.
func internal(what string, err error) error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s: %w", what, err))
}

// storeErr maps a store error: ErrNotFound becomes NotFound with the given description.
func storeErr(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return notFound("%s not found (it does not exist, or belongs to another API key's workspace)", what)
	}
	return internal("store", err)
}

// operationError turns an error into the error recorded on a failed operation.
func operationError(err error) *loopsv1.OperationError {
	code := connect.CodeOf(err)
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	cat := loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER
	switch code {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange,
		connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodePermissionDenied, connect.CodeUnimplemented:
		cat = loopsv1.ErrorCategory_ERROR_CATEGORY_USER
	}
	return &loopsv1.OperationError{Code: int32(code), Message: msg, Category: cat}
}

func unavailable(format string, args ...any) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf(format, args...))
}
