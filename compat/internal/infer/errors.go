package infer

import (
	"fmt"
	"net/http"
)

// Error is a client error the shared machinery finds (a malformed model string, messages a
// chat template refuses): each adapter answers it in its own protocol's error shape.
type Error struct {
	// Status is the HTTP status, 4xx.
	Status int
	// Param names the request field at fault ("" for none).
	Param string
	// Code is a stable machine-readable reason, such as "invalid_value".
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// BadField returns a 400 that names the request field param.
func BadField(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Param: param, Code: "invalid_value", Message: fmt.Sprintf(format, args...)}
}

// tooLong returns the 400 for a prompt over the model's token limit; its code is OpenAI's
// for it, context_length_exceeded.
func tooLong(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Param: param, Code: "context_length_exceeded", Message: fmt.Sprintf(format, args...)}
}

// Truncate shortens s to 40 bytes for an error message.
func Truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
