package infer

import (
	"context"
	"net/http"
)

// SessionHeader names the Loops session (the Tinker SDK's session_id, loops.v1 Session.id)
// that an OpenAI or Anthropic route request samples in. Its usage is then metered to that
// session (UsageBucket.session_id), as the session's Tinker sample requests are, so a
// client that mixes both routes sees one session's cost in one place (`loops cookbook check
// --pilot` counts its pilot's evaluation this way). Without it the request samples in no
// session. The session must be the caller's workspace's and live.
const SessionHeader = "X-Loops-Session"

// maxSessionHeader bounds the header's length; session ids are far shorter.
const maxSessionHeader = 128

type sessionKey struct{}

// WithSessions returns h with each request's SessionHeader (when set) in its context, where
// the engine's samplers read it.
func WithSessions(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(SessionHeader); id != "" {
			r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, id))
		}
		h.ServeHTTP(w, r)
	})
}

// sessionOf is the request's SessionHeader, checked: at most maxSessionHeader bytes of
// letters, digits, '-', '_' and '.'; "" when the header was not sent.
func sessionOf(ctx context.Context) (string, error) {
	id, _ := ctx.Value(sessionKey{}).(string)
	if len(id) > maxSessionHeader {
		return "", BadField(SessionHeader, "the %s header is %d bytes long: send a session id (at most %d bytes), or leave the header out", SessionHeader, len(id), maxSessionHeader)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", BadField(SessionHeader, "the %s header %q is not a session id (letters, digits, '-', '_' and '.'): send the id the Tinker SDK's session has, or leave the header out", SessionHeader, Truncate(id))
		}
	}
	return id, nil
}
