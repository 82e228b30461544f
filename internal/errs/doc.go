// Package errs is the one error table of every Loops surface: for each connect (gRPC) code,
// the HTTP status loops.v1 REST and Connect answer (the standard gRPC→HTTP table), the status
// Tinker's routes answer (compat may diverge from the standard table only here), whether
// the error is the user's or the server's, whether a retry may succeed, whether its message
// is masked, and its default machine-readable reason.
//
// Every error a client sees carries a stable reason: on loops.v1 a google.rpc.ErrorInfo
// detail in the "loops.dev" domain, in Tinker bodies the "reason" field. Errors of masked
// codes (Internal, Unknown, DataLoss) reach clients as "internal error, id <id>"; the edge
// that masks them logs the full error under the same id. A request whose client went away
// is logged and counted as 499 and answered with nothing.
package errs
