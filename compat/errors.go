package compat

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
)

// apiError is an error compat answers with a given HTTP status. Decoders and handlers
// return it for client mistakes they detect themselves, with statuses the code table does
// not give (413, 415, 408, 410).
type apiError struct {
	status int
	// code is the connect code's name ("invalid_argument"), sent as the body's code.
	code string
	// reason is the machine-readable reason (internal/errs); empty: the code's default.
	reason string
	detail string
}

func (e *apiError) Error() string { return e.detail }

// badRequest returns a 400 error with a formatted detail.
func badRequest(format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, code: "invalid_argument", detail: fmt.Sprintf(format, args...)}
}

// tooLarge returns a 413 error with a formatted detail.
func tooLarge(format string, args ...any) error {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "resource_exhausted",
		reason: errs.ReasonBodyTooLarge, detail: fmt.Sprintf(format, args...)}
}

// notImplemented returns the error for a Tinker route Loops does not serve: a 404, not a
// 501, because the SDK retries every 5xx for minutes while a 404 fails the call at once.
func notImplemented(format string, args ...any) error {
	return &apiError{status: http.StatusNotFound, code: "unimplemented",
		reason: errs.ReasonRouteNotServed, detail: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON body of every error answer. The SDK parses none of it (it puts the
// body in the exception's message); code and reason are for other clients and logs.
type errorBody struct {
	// Detail says what was wrong and how to fix it.
	Detail string `json:"detail"`
	// Code is the connect (gRPC) code's name, as in Connect's own JSON errors.
	Code string `json:"code"`
	// Reason is the stable machine-readable reason: the loops.v1 ErrorInfo reason.
	Reason string `json:"reason"`
}

// answer is how compat answers an error.
type answer struct {
	status int
	body   errorBody
	// id is set when the detail was masked: the full error is logged under it.
	id string
}

// classify turns any error into (HTTP status, connect code name, detail).
func classify(err error) (int, string, string) {
	a := classifyError(err)
	return a.status, a.body.Code, a.body.Detail
}

// answerOf is classifyError as the HTTP edge (internal/httpedge) takes it.
func answerOf(err error) httpedge.Answer {
	a := classifyError(err)
	return httpedge.Answer{Status: a.status, Body: a.body, ID: a.id, Reason: a.body.Reason, Message: a.body.Detail}
}

// classifyError maps err through the one error table (internal/errs): the status is the
// table's TinkerStatus, internal errors are masked to "internal error, id <id>".
func classifyError(err error) answer {
	var ae *apiError
	if errors.As(err, &ae) {
		reason := ae.reason
		if reason == "" {
			reason = strings.ToUpper(ae.code)
		}
		return answer{status: ae.status, body: errorBody{Detail: ae.detail, Code: ae.code, Reason: reason}}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return answer{status: http.StatusRequestEntityTooLarge, body: errorBody{
			Detail: fmt.Sprintf("request body is larger than the server's limit of %d bytes; send smaller requests (fewer datums per forward_backward chunk)", mbe.Limit),
			Code:   connect.CodeResourceExhausted.String(), Reason: errs.ReasonBodyTooLarge}}
	}
	out, msg := httpedge.Public(err)
	status, reason := out.Entry.TinkerStatus, errs.Reason(out.Err)
	if reason == errs.ReasonBudgetExceeded {
		status = http.StatusForbidden // the SDK fails it at once (errs.ReasonBudgetExceeded)
	}
	return answer{status: status, id: out.ID, body: errorBody{
		Detail: msg, Code: out.Err.Code().String(), Reason: reason}}
}
