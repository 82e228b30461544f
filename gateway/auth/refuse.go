package auth

import (
	"net/http"

	"connectrpc.com/connect"
)

// Refuse answers r with an error of code and reason (errs.Reason; "" for the code's
// default), in the form its surface reads, as Middleware answers its own refusals: the
// policy's ErrorShapes, else gRPC status headers or a JSON body. A ResourceExhausted one
// carries the default Retry-After. Middleware that runs after authentication (the audit
// log's) refuses through it.
func (p Policy) Refuse(w http.ResponseWriter, r *http.Request, code connect.Code, reason string, err error) {
	p.refuse(w, r, refusal{code: code, reason: reason, err: err})
}
