package errs

import (
	"errors"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ReasonLimitReached: a cap on what a workspace or a session holds at once (live sessions,
// runs or samplers of a session) is reached; the message and the ErrorInfo's "limit"
// metadata name it. Retry after ending some, or as Retry-After says.
const ReasonLimitReached = "LIMIT_REACHED"

// MetadataLimit is the ErrorInfo metadata key that names the limit an error hit.
const MetadataLimit = "limit"

// HeaderRetryAfter is the HTTP header every edge sets on a 429.
const HeaderRetryAfter = "Retry-After"

// DefaultRetryAfter is the Retry-After of a ResourceExhausted error that carries no hint.
const DefaultRetryAfter = time.Second

// Limit returns an error with code for a limit that was hit: an ErrorInfo with reason whose
// metadata names the limit, and a google.rpc.RetryInfo with the retry hint, which every edge
// sends as a Retry-After header (see RetryAfter).
func Limit(code connect.Code, reason, limit string, retry time.Duration, err error) *connect.Error {
	ce := connect.NewError(code, err)
	attach(ce, reason, map[string]string{MetadataLimit: limit})
	if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); derr == nil {
		ce.AddDetail(d)
	}
	return ce
}

// RetryAfter returns how long a client should wait before retrying err: the delay of its
// google.rpc.RetryInfo, else DefaultRetryAfter for ResourceExhausted. ok is false for any
// other error.
func RetryAfter(err error) (d time.Duration, ok bool) {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, det := range ce.Details() {
			if v, derr := det.Value(); derr == nil {
				if ri, isRetry := v.(*errdetails.RetryInfo); isRetry && ri.GetRetryDelay() != nil {
					return ri.GetRetryDelay().AsDuration(), true
				}
			}
		}
	}
	if connect.CodeOf(err) == connect.CodeResourceExhausted {
		return DefaultRetryAfter, true
	}
	return 0, false
}

// RetryAfterValue formats d as a Retry-After header value: whole seconds, rounded up, at
// least 1.
func RetryAfterValue(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}

// WithRetryAfterHeader returns ce with a Retry-After header in its metadata when RetryAfter
// gives one (the Connect protocol sends an error's metadata as response headers). ce itself
// is not changed, since it may be shared: the result is a copy.
func WithRetryAfterHeader(ce *connect.Error) *connect.Error {
	d, ok := RetryAfter(ce)
	if !ok || ce.Meta().Get(HeaderRetryAfter) != "" {
		return ce
	}
	cp := connect.NewError(ce.Code(), errors.New(ce.Message()))
	for _, det := range ce.Details() {
		cp.AddDetail(det)
	}
	for k, v := range ce.Meta() {
		cp.Meta()[k] = v
	}
	cp.Meta().Set(HeaderRetryAfter, RetryAfterValue(d))
	return cp
}

// HeaderShouldRetry tells a Stainless-generated client (the tinker SDK) whether to retry an
// error answer: "false" makes it fail the call at once instead of backing off.
const HeaderShouldRetry = "X-Should-Retry"

// Final marks ce as an error that retrying cannot cure (a limit only a person can raise):
// every edge sends it with X-Should-Retry: false, so SDKs fail at once with its message. It
// returns ce.
func Final(ce *connect.Error) *connect.Error {
	ce.Meta().Set(HeaderShouldRetry, "false")
	return ce
}

// IsFinal reports whether err is marked Final.
func IsFinal(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(HeaderShouldRetry) == "false"
}
