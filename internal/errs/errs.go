package errs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Domain is the ErrorInfo domain of every reason Loops sends.
const Domain = "loops.dev"

// StatusClientClosedRequest is the status logged and counted for a request whose client went
// away before the answer (nginx's 499); nothing is sent.
const StatusClientClosedRequest = 499

// MetadataErrorID is the ErrorInfo metadata key that holds a masked error's id.
const MetadataErrorID = "error_id"

// Reasons finer than the code's own. Each is stable: clients may match on it.
const (
	// ReasonQueueFull: a queue with a fixed capacity (sampling requests waiting, a run's
	// pending operations) is full; retry with backoff.
	ReasonQueueFull = "QUEUE_FULL"
	// ReasonRateLimited: the caller has too many requests in flight or sent too many too
	// fast; retry with backoff.
	ReasonRateLimited = "RATE_LIMITED"
	// ReasonBodyTooLarge: the request body (as sent or decompressed) is over the server's
	// limit; send smaller requests. Not retryable as is.
	ReasonBodyTooLarge = "BODY_TOO_LARGE"
	// ReasonDecompressBusy: the server's budget for decompressing bodies had no room in
	// time; retry with backoff.
	ReasonDecompressBusy = "DECOMPRESS_BUSY"
	// ReasonBodyReadTimeout: the body did not arrive within the server's read timeout.
	ReasonBodyReadTimeout = "BODY_READ_TIMEOUT"
	// ReasonUnsupportedEncoding: the Content-Encoding is not supported.
	ReasonUnsupportedEncoding = "UNSUPPORTED_ENCODING"
	// ReasonRouteNotServed: a Tinker route Loops does not serve (answered 404, not 501).
	ReasonRouteNotServed = "ROUTE_NOT_SERVED"
	// ReasonCustomLossClientSide: a server-side custom loss (create_custom_loss) was sent;
	// Loops runs custom losses on the client (forward_backward_custom), answered 400.
	ReasonCustomLossClientSide = "CUSTOM_LOSS_CLIENT_SIDE"
	// ReasonSessionEnded: the session has expired or finished (a heartbeat answers 410).
	ReasonSessionEnded = "SESSION_ENDED"
	// ReasonResultExpired: the operation finished, but its large result (forward/backward
	// outputs, sampled sequences) is no longer kept (time or size budget, or a restart);
	// rerun the step. Tinker's retrieve_future answers it 410.
	ReasonResultExpired = "RESULT_EXPIRED"
	// ReasonClientClosed: the client went away before the answer (logged and counted only).
	ReasonClientClosed = "CLIENT_CLOSED_REQUEST"
	// ReasonNoLeader: a standby gateway knows no leader it can reach (the leader died and
	// its lease has not lapsed yet, or this gateway is taking over); retry in a second
	// (HTTP 503, which the tinker SDK retries).
	ReasonNoLeader = "NO_LEADER"
	// ReasonOperatorRequired: the call is an operator's (PoolService) and the key is not an
	// operator key (HTTP 403); configure one with loops serve --operator-key.
	ReasonOperatorRequired = "OPERATOR_REQUIRED"
	// ReasonNoPools: the gateway's backend runs no worker pools, so PoolService has nothing
	// to show or change (HTTP 400, FAILED_PRECONDITION).
	ReasonNoPools = "NO_POOLS"
	// ReasonBudgetExceeded: the work's estimated cost would take a workspace or an API key
	// past a budget (RESOURCE_EXHAUSTED, final: retrying cannot cure it until an operator or
	// admin raises the budget or a new month starts). Tinker's routes answer it 403 (the
	// SDK's PermissionDeniedError): the tinker SDK (0.38) retries a 429 on forward_backward
	// and sample for 5 minutes whatever X-Should-Retry says, and pauses on a 402 for an hour
	// (waiting for billing to be set up), but fails a 403 at once.
	ReasonBudgetExceeded = "BUDGET_EXCEEDED"
)

// Category says whose fault an error is.
type Category int

const (
	// User errors are the client's to fix; retrying the same request fails the same way.
	User Category = iota + 1
	// Server errors are the server's (or its capacity's); a retry may succeed.
	Server
)

// String returns "user" or "server", the values of Tinker's RequestErrorCategory.
func (c Category) String() string {
	if c == User {
		return "user"
	}
	return "server"
}

// Proto returns the category as loops.v1 records it on an operation.
func (c Category) Proto() loopsv1.ErrorCategory {
	if c == User {
		return loopsv1.ErrorCategory_ERROR_CATEGORY_USER
	}
	return loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER
}

// Entry is one row of the table.
type Entry struct {
	// Code is the connect (gRPC) code.
	Code connect.Code
	// HTTPStatus is the standard gRPC→HTTP status: what loops.v1 REST answers (and what
	// the Connect protocol sends on unary calls).
	HTTPStatus int
	// TinkerStatus is what Tinker's routes answer. It differs from HTTPStatus only where
	// the Tinker SDK would retry a permanent error for minutes: AlreadyExists is 400, not
	// 409, and Unimplemented is 404, not 501.
	TinkerStatus int
	// Category says whose fault it is.
	Category Category
	// Retryable says a client may retry the same request and succeed. On Tinker routes it
	// is exactly the SDK's retry rule applied to TinkerStatus (408, 409, 429, ≥500).
	Retryable bool
	// Masked says the message never reaches a client: it is logged under an error id and
	// replaced by "internal error, id <id>".
	Masked bool
	// Reason is the default machine-readable reason: the code's name in upper snake case.
	Reason string
}

// table holds every code, indexed by code. Codes outside it read as Unknown.
var table = func() [17]Entry {
	var t [17]Entry
	for _, e := range []Entry{
		{connect.CodeCanceled, StatusClientClosedRequest, StatusClientClosedRequest, User, false, false, ""},
		{connect.CodeUnknown, http.StatusInternalServerError, http.StatusInternalServerError, Server, true, true, ""},
		{connect.CodeInvalidArgument, http.StatusBadRequest, http.StatusBadRequest, User, false, false, ""},
		{connect.CodeDeadlineExceeded, http.StatusGatewayTimeout, http.StatusGatewayTimeout, Server, true, false, ""},
		{connect.CodeNotFound, http.StatusNotFound, http.StatusNotFound, User, false, false, ""},
		{connect.CodeAlreadyExists, http.StatusConflict, http.StatusBadRequest, User, false, false, ""},
		{connect.CodePermissionDenied, http.StatusForbidden, http.StatusForbidden, User, false, false, ""},
		{connect.CodeResourceExhausted, http.StatusTooManyRequests, http.StatusTooManyRequests, Server, true, false, ""},
		{connect.CodeFailedPrecondition, http.StatusBadRequest, http.StatusBadRequest, User, false, false, ""},
		{connect.CodeAborted, http.StatusConflict, http.StatusConflict, Server, true, false, ""},
		{connect.CodeOutOfRange, http.StatusBadRequest, http.StatusBadRequest, User, false, false, ""},
		{connect.CodeUnimplemented, http.StatusNotImplemented, http.StatusNotFound, User, false, false, ""},
		{connect.CodeInternal, http.StatusInternalServerError, http.StatusInternalServerError, Server, true, true, ""},
		{connect.CodeUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable, Server, true, false, ""},
		{connect.CodeDataLoss, http.StatusInternalServerError, http.StatusInternalServerError, Server, true, true, ""},
		{connect.CodeUnauthenticated, http.StatusUnauthorized, http.StatusUnauthorized, User, false, false, ""},
	} {
		e.Reason = strings.ToUpper(e.Code.String())
		t[e.Code] = e
	}
	return t
}()

// Codes returns every code of the table, in code order.
func Codes() []connect.Code {
	out := make([]connect.Code, 0, len(table))
	for _, e := range table {
		if e.Code != 0 {
			out = append(out, e.Code)
		}
	}
	return out
}

// Lookup returns the table's row for code; a code outside the table is Unknown.
func Lookup(code connect.Code) Entry {
	if int(code) < len(table) && table[code].Code != 0 {
		return table[code]
	}
	return table[connect.CodeUnknown]
}

// Of returns the row for err's code (connect.CodeOf: Unknown for an error without one).
func Of(err error) Entry { return Lookup(connect.CodeOf(err)) }

// New returns a connect error with code, the message of err and an ErrorInfo detail with
// reason (the code's default when reason is empty).
func New(code connect.Code, reason string, err error) *connect.Error {
	ce := connect.NewError(code, err)
	attach(ce, reason, nil)
	return ce
}

// Incident returns an Internal error whose message is already fit for clients: the caller
// has logged the details under id and msg names it. The edge passes it on unmasked.
func Incident(id, msg string) *connect.Error {
	ce := connect.NewError(connect.CodeInternal, errors.New(msg))
	attach(ce, "", map[string]string{MetadataErrorID: id})
	return ce
}

// Info returns err's ErrorInfo in the loops.dev domain, or nil.
func Info(err error) *errdetails.ErrorInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info
		}
	}
	return nil
}

// Reason returns err's machine-readable reason: its ErrorInfo's, else its code's default.
func Reason(err error) string {
	if info := Info(err); info != nil && info.GetReason() != "" {
		return info.GetReason()
	}
	return Of(err).Reason
}

// Outcome is what an edge answers for an error.
type Outcome struct {
	// Err is what the client sees: the same code, a reason in an ErrorInfo detail, and the
	// message masked when the code is.
	Err *connect.Error
	// Entry is the table's row for the code.
	Entry Entry
	// ID is set when the message was masked: the edge logs the original error under it.
	ID string
}

// Edge turns an error leaving a handler into what its client may see. A masked code gets a
// new id and the message "internal error, id <id>", unless the error is already public (an
// Incident, or an error that passed an edge before). An error without a loops.dev ErrorInfo
// gets one with its code's default reason.
func Edge(err error) Outcome {
	e := Of(err)
	info := Info(err)
	if e.Masked && (info == nil || info.GetMetadata()[MetadataErrorID] == "") {
		id := NewID()
		ce := connect.NewError(e.Code, errors.New("internal error, id "+id))
		reason := e.Reason
		if info != nil && info.GetReason() != "" {
			reason = info.GetReason()
		}
		attach(ce, reason, map[string]string{MetadataErrorID: id})
		return Outcome{Err: ce, Entry: e, ID: id}
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		ce = connect.NewError(e.Code, err)
	}
	if info == nil {
		// Copy rather than mutate: the error may be shared (a stored operation's, a
		// sentinel) and read concurrently.
		cp := connect.NewError(ce.Code(), errors.New(ce.Message()))
		for _, d := range ce.Details() {
			cp.AddDetail(d)
		}
		for k, v := range ce.Meta() {
			cp.Meta()[k] = v
		}
		attach(cp, e.Reason, nil)
		ce = cp
	}
	return Outcome{Err: ce, Entry: e}
}

// ClientGone reports whether ctx (a request's context) ended because its client went away:
// canceled, not past a deadline.
func ClientGone(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}

// NewID returns a random error id (12 hex digits).
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// attach adds a loops.dev ErrorInfo with reason (the code's default when empty) to ce.
func attach(ce *connect.Error, reason string, md map[string]string) {
	if reason == "" {
		reason = Lookup(ce.Code()).Reason
	}
	d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md})
	if err == nil {
		ce.AddDetail(d)
	}
}
