package auth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzTokenMiddleware: any credential the middleware is sent, token-shaped or not, is
// answered 200 only when it is a good key or an unaltered token, 401 (or 429) otherwise,
// never a panic or a 5xx; a token refusal carries WWW-Authenticate.
func FuzzTokenMiddleware(f *testing.F) {
	c := newClock()
	st := openStoreF(f)
	k, err := ParseKeys([]string{"tml-flag=flag-ws"})
	if err != nil {
		f.Fatal(err)
	}
	k = k.WithRecords(NewDirectory(st, DirectoryOptions{Now: c.Now}), NewTokens(st, TokenOptions{Now: c.Now}))
	good, err := k.Tokens().Issue(f.Context(), Identity{Workspace: "flag-ws", KeyID: KeyIDOf("tml-flag"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag})
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(good, ".")
	f.Add(good)
	f.Add(parts[0] + "." + parts[1] + ".")
	f.Add(parts[0] + ".." + parts[2])
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.")
	f.Add("eyJ.eyJ.eyJ")
	f.Add("eyJhbGciOiJFZERTQSIsImtpZCI6IiJ9.e30.AAAA")
	f.Add("tml-flag")
	f.Add("")
	h := k.Middleware(Policy{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(Workspace(r.Context())))
	}))
	f.Fuzz(func(t *testing.T, cred string) {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.Header.Set(HeaderName, cred)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusOK:
			if cred != good && strings.TrimSpace(cred) != "tml-flag" {
				t.Fatalf("credential %q accepted", cred)
			}
			if w.Body.String() != "flag-ws" {
				t.Fatalf("workspace %q", w.Body.String())
			}
		case http.StatusUnauthorized, http.StatusTooManyRequests:
			if LooksLikeToken(cred) && w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
				t.Fatalf("token %q refused without WWW-Authenticate: %s", cred, w.Body.String())
			}
		default:
			t.Fatalf("credential %q: status %d %s", cred, w.Code, w.Body.String())
		}
	})
}
