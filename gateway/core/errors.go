package core

import (
	"errors"

	"github.com/loops-dev/loops/gateway/core/apierr"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// The core's client errors are package apierr's; these are its short names here.

func invalidArgument(format string, args ...any) error {
	return apierr.InvalidArgument(format, args...)
}

func failedPrecondition(format string, args ...any) error {
	return apierr.FailedPrecondition(format, args...)
}

func notFound(format string, args ...any) error { return apierr.NotFound(format, args...) }

func resourceExhausted(format string, args ...any) error {
	return apierr.ResourceExhausted(format, args...)
}

// internal wraps an unexpected error (apierr.Internal: masked at every edge; the request's
// own context ending, or the lease lost, is not internal).
func internal(what string, err error) error { return apierr.Internal(what, err) }

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

func unavailable(format string, args ...any) error { return apierr.Unavailable(format, args...) }
