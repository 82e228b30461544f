package infer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSessionHeader: any X-Loops-Session value either passes through WithSessions to
// sessionOf unchanged (a session id: at most 128 bytes of letters, digits, '-', '_', '.')
// or is a 400 naming the header; it never panics.
func FuzzSessionHeader(f *testing.F) {
	for _, s := range []string{"", "sess-7xeek4aa5x4s3geh", "a b", "ü", "sess\x00", string(make([]byte, 129))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header[SessionHeader] = []string{value}
		var ctx context.Context
		WithSessions(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ctx = r.Context() })).ServeHTTP(httptest.NewRecorder(), r)
		got, err := sessionOf(ctx)
		if err != nil {
			var e *Error
			require.True(t, errors.As(err, &e))
			require.Equal(t, http.StatusBadRequest, e.Status)
			require.Equal(t, SessionHeader, e.Param)
			return
		}
		require.Equal(t, value, got)
		require.LessOrEqual(t, len(got), maxSessionHeader)
		for _, c := range got {
			require.True(t, c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.', "%q", got)
		}
	})
}
