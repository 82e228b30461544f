package errs

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
)

// TestMessage: a Connect error's message comes without its code, also when wrapped; any
// other error is its text.
func TestMessage(t *testing.T) {
	ce := connect.NewError(connect.CodeUnavailable, errors.New("the pool is scaling"))
	require.Equal(t, "unavailable: the pool is scaling", ce.Error())
	require.Equal(t, "the pool is scaling", Message(ce))
	require.Equal(t, "the pool is scaling", Message(fmt.Errorf("scaling: %w", ce)))
	require.Equal(t, "plain", Message(errors.New("plain")))
}
