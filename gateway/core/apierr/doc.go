// Package apierr makes the errors the core's services answer clients with: Connect errors
// whose code says what went wrong and whose message says how to fix it. The core and the
// packages extracted from it (gateway/core/...) build their client errors here, so one
// kind of failure has one code everywhere.
//
// Internal is for failures that are the server's: every edge (the gateway's interceptor,
// compat, a failed operation's record) masks an Internal error to "internal error, id <id>"
// and logs the full text under that id (internal/errs).
package apierr
