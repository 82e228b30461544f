// Package httpedge is the one HTTP edge of the JSON surfaces: Tinker's routes (compat), the
// OpenAI- and Anthropic-compatible APIs, and the gateway's outermost handler.
//
// A Surface pairs a name (for logs) with its protocol's classify function, which turns any
// error into an HTTP status, the protocol's JSON error body and, for a masked internal
// error, the id it is logged under. The Surface then does everything the protocols share:
//
//   - Handle adapts a route that returns an error to an http.Handler;
//   - WriteError answers an error: nothing when the client went away (logged as 499,
//     except a 408, whose client is still there), otherwise logged by category (an error
//     id for a masked error, Error for other 5xx but 503, Debug for refusals), with
//     Retry-After on a 429 that carries one;
//   - Recover answers a panic as an internal error with a new error id, logging the panic
//     and its stack once under that id; a panic once the response has begun cuts the
//     response short instead (http.ErrAbortHandler), and http.ErrAbortHandler itself passes
//     through.
//
// Each protocol keeps its own error body, statuses and headers: only its classify function
// knows them.
package httpedge
