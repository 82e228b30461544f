package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/ckhttp"
)

// TestOpenAPIDocumentListsEveryRoute: GET /openapi.json lists the plain-HTTP routes
// (checkpoint export and import) beside the generated RPC routes, every $ref in it
// resolves, and every route and method it lists is served: called with the API key and no
// parameters or body, each answers something other than 404/405 from the mux.
func TestOpenAPIDocumentListsEveryRoute(t *testing.T) {
	url := startServer(t)
	resp, err := http.Get(url + "/openapi.json")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var doc struct {
		Paths       map[string]map[string]json.RawMessage `json:"paths"`
		Definitions map[string]json.RawMessage            `json:"definitions"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	for path, method := range map[string]string{ckhttp.ExportPath: "get", ckhttp.ImportPath: "post"} {
		_, ok := doc.Paths[path][method]
		require.True(t, ok, "%s %s is not in the document", method, path)
	}
	for _, m := range regexp.MustCompile(`"#/definitions/([^"]+)"`).FindAllStringSubmatch(string(raw), -1) {
		_, ok := doc.Definitions[m[1]]
		require.True(t, ok, "a $ref to a missing definition %s", m[1])
	}
	params := regexp.MustCompile(`\{[^}]+\}`)
	for path, methods := range doc.Paths {
		for method := range methods {
			u := url + params.ReplaceAllString(path, "x")
			req, err := http.NewRequestWithContext(t.Context(), strings.ToUpper(method), u, bytes.NewReader(nil))
			require.NoError(t, err)
			req.Header.Set("X-API-Key", keyA)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// a handler's 404 says what was not found; the mux's is plain text, the REST
			// gateway's a bare "Not Found" (and 501 for a method it does not route)
			var body struct{ Message string }
			_ = json.Unmarshal(b, &body)
			unrouted := resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented ||
				(resp.StatusCode == http.StatusNotFound && (!json.Valid(b) || body.Message == "Not Found"))
			require.False(t, unrouted, "%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
}
