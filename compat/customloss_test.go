package compat

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCreateCustomLossIsRefusedWithAReason: create_custom_loss answers a 400 (not a 404 that
// looks like a bug, nor a 5xx the SDK retries for minutes) that says custom losses run on
// the client; a malformed body says so first; client/config keeps the SDK off the route.
func TestCreateCustomLossIsRefusedWithAReason(t *testing.T) {
	e := newEnv(t)
	r := e.postJSON("/api/v1/create_custom_loss", `{"session_id":"s","custom_loss_seq_id":0,"name":"my_loss",
		"inputs":[{"name":"logprobs","rank":1}],"graph":{"format":1,"nodes":[]},"type":"create_custom_loss"}`)
	require.Equal(t, 400, r.status)
	body := r.json(t)
	require.Contains(t, body["detail"], "forward_backward_custom computes the loss on your client")
	require.Equal(t, "unimplemented", body["code"])
	require.Equal(t, "CUSTOM_LOSS_CLIENT_SIDE", body["reason"])

	r = e.postJSON("/api/v1/create_custom_loss", `{"session_id":`)
	require.Equal(t, 400, r.status)
	require.Contains(t, r.json(t)["detail"], "malformed JSON")

	cfg := e.postJSON("/api/v1/client/config", `{"sdk_version":"0.38.0"}`).json(t)
	require.Equal(t, false, cfg["custom_loss_server_side"])
}
