package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestConsoleAccessRequests: a member files a request with the console's form and sees
// only its own; a member gets no grant form and a forged grant is refused; the workspace's
// admin sees every request and grants it from the page, which changes the workspace's
// limits; another workspace's admin sees none of it.
func TestConsoleAccessRequests(t *testing.T) {
	const operator = "tml-console-operator"
	pol, err := policy.Parse([]byte("default:\n  max_sequence_length: 64\n"))
	require.NoError(t, err)
	base := startServerWith(t, func(c *gateway.Config) {
		require.NoError(t, c.Keys.AddOperatorKeys([]string{operator}))
		c.Core.Policy = pol
	})
	keys := loopsv1connect.NewKeyServiceClient(http.DefaultClient, base, withKey(operator))
	newKey := func(ws string, role loopsv1.KeyRole) string {
		res, err := keys.CreateKey(t.Context(), &loopsv1.CreateKeyRequest{Workspace: ws, Role: role})
		require.NoError(t, err)
		return res.GetSecret()
	}
	adminA, adminB := newKey("ws-a", loopsv1.KeyRole_KEY_ROLE_ADMIN), newKey("ws-b", loopsv1.KeyRole_KEY_ROLE_ADMIN)

	member := newBrowser(t, base)
	member.signIn(keyA) // a flag key: a member of ws-a
	tok := member.csrf()
	code, _, body := member.get("/console/access")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="request-form"`)
	require.Contains(t, body, "Your requests")
	require.NotContains(t, body, `id="deliveries"`)

	code, h, body := member.post("/console/access/request", url.Values{"csrf": {tok}, "model": {"loops/tiny"},
		"max_sequence_length": {"256"}, "reason": {"longer chats"}})
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Contains(t, h.Get("Location"), "/console/access?done=request+acr-")
	code, _, body = member.post("/console/access/request", url.Values{"csrf": {tok}, "model": {"loops/tiny"},
		"max_sequence_length": {"-4"}, "reason": {"x"}})
	require.Equal(t, http.StatusBadRequest, code, body)
	code, _, body = member.post("/console/access/request", url.Values{"csrf": {tok}, "model": {"loops/tiny"},
		"max_sequence_length": {"99999999"}, "reason": {"x"}})
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "the maximum is")
	_, _, body = member.get("/console/access")
	id := regexp.MustCompile(`acr-[0-9a-f]{16}`).FindString(body)
	require.NotEmpty(t, id, body)
	require.NotContains(t, body, `action="/console/access/decide"`, "a member gets no grant form")
	code, _, body = member.post("/console/access/decide", url.Values{"csrf": {tok}, "id": {id}, "decision": {"grant"}})
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "needs a workspace admin key")

	other := newBrowser(t, base)
	other.signIn(adminB)
	_, _, body = other.get("/console/access")
	require.NotContains(t, body, id, "another workspace's admin sees none of ws-a's requests")
	code, _, body = other.post("/console/access/decide", url.Values{"csrf": {other.csrf()}, "id": {id}, "decision": {"grant"}})
	require.Equal(t, http.StatusNotFound, code, body)

	admin := newBrowser(t, base)
	admin.signIn(adminA)
	_, _, body = admin.get("/console/access")
	require.Contains(t, body, id)
	require.Contains(t, body, "The workspace's requests")
	require.Contains(t, body, `action="/console/access/decide"`)
	require.Contains(t, body, `id="deliveries"`)
	code, h, body = admin.post("/console/access/decide", url.Values{"csrf": {admin.csrf()}, "id": {id}, "decision": {"grant"}, "hours": {"2"}, "reason": {"ok"}})
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Contains(t, h.Get("Location"), "granted")

	ws, err := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, base, withKey(keyA)).GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	require.Equal(t, int32(256), ws.GetLimits().GetModels()[0].GetMaxSequenceLength(), "the grant raised ws-a's limit on loops/tiny")
	_, _, body = member.get("/console/access")
	require.Contains(t, body, "ACCESS_STATE_GRANTED")
}
