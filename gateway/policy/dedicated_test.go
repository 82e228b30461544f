package policy

import (
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
)

// TestDedicatedKey: dedicated is off, allowed (the default: a run gets a pool when it asks)
// or always; anything else is refused when the file is read.
func TestDedicatedKey(t *testing.T) {
	p, err := Parse([]byte(`{"default": {}, "workspaces": {"off": {"dedicated": "off"}, "all": {"dedicated": "always"}}}`))
	require.NoError(t, err)
	e, err := NewEnforcer(p, nil)
	require.NoError(t, err)
	for _, c := range []struct {
		ws        string
		ask, want bool
	}{{"any", false, false}, {"any", true, true}, {"all", false, true}, {"all", true, true}, {"off", false, false}} {
		got, err := e.Dedicated(c.ws, c.ask)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%s asking %v", c.ws, c.ask)
	}
	_, err = e.Dedicated("off", true)
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "dedicated: off")
	_, err = Parse([]byte(`{"default": {"dedicated": "sometimes"}}`))
	require.ErrorContains(t, err, "use off, allowed or always")
}
