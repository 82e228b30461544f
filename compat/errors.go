package compat

import (
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
)

// apiError is an error compat answers with a given HTTP status. Decoders and handlers
// return it for client mistakes they detect themselves.
type apiError struct {
	status int
	code   string
	detail string
}

func (e *apiError) Error() string { return e.detail }

// badRequest returns a 400 error with a formatted detail.
func badRequest(format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, code: "invalid_argument", detail: fmt.Sprintf(format, args...)}
}

// tooLarge returns a 413 error with a formatted detail.
func tooLarge(format string, args ...any) error {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "resource_exhausted", detail: fmt.Sprintf(format, args...)}
}

// notImplemented returns the error for a Tinker route Loops does not serve: a 404, not a
// 501, because the SDK retries every 5xx for minutes while a 404 fails the call at once.
func notImplemented(format string, args ...any) error {
	return &apiError{status: http.StatusNotFound, code: "unimplemented", detail: fmt.Sprintf(format, args...)}
}

// statusForCode is the one table that maps core (connect) error codes to HTTP statuses.
// AlreadyExists is 400, not 409: the SDK retries 409 for minutes as a lock timeout, so a
// permanent conflict must not use it.
var statusForCode = map[connect.Code]int{
	connect.CodeInvalidArgument:    http.StatusBadRequest,
	connect.CodeFailedPrecondition: http.StatusBadRequest,
	connect.CodeOutOfRange:         http.StatusBadRequest,
	connect.CodeAlreadyExists:      http.StatusBadRequest,
	connect.CodeUnauthenticated:    http.StatusUnauthorized,
	connect.CodePermissionDenied:   http.StatusForbidden,
	connect.CodeNotFound:           http.StatusNotFound,
	connect.CodeResourceExhausted:  http.StatusTooManyRequests,
	connect.CodeUnimplemented:      http.StatusNotImplemented,
	connect.CodeUnavailable:        http.StatusServiceUnavailable,
	connect.CodeDeadlineExceeded:   http.StatusGatewayTimeout,
}

// errorBody is the JSON body of every error answer.
type errorBody struct {
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// classify turns any error into (HTTP status, connect code name, detail).
func classify(err error) (int, string, string) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, ae.code, ae.detail
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		status, ok := statusForCode[ce.Code()]
		if !ok {
			status = http.StatusInternalServerError
		}
		msg := ce.Message()
		if msg == "" {
			msg = ce.Code().String()
		}
		return status, ce.Code().String(), msg
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, "resource_exhausted",
			fmt.Sprintf("request body is larger than the server's limit of %d bytes; send smaller requests (fewer datums per forward_backward chunk)", mbe.Limit)
	}
	return http.StatusInternalServerError, connect.CodeInternal.String(), "internal error: " + err.Error()
}

// isUserCode reports whether a core error code is the client's fault.
func isUserCode(c connect.Code) bool {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange,
		connect.CodeAlreadyExists, connect.CodeNotFound, connect.CodePermissionDenied,
		connect.CodeUnauthenticated:
		return true
	}
	return false
}
