package reference

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
)

// TestItemErrorKeepsAWrappedCode: an item's error reports the connect code it carries, even
// wrapped; any other error is internal.
func TestItemErrorKeepsAWrappedCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code connect.Code
		msg  string
	}{
		{connect.NewError(connect.CodeNotFound, errors.New("adapter a does not exist")), connect.CodeNotFound, "adapter a does not exist"},
		{fmt.Errorf("item 3: %w", connect.NewError(connect.CodeInvalidArgument, errors.New("bad weights"))), connect.CodeInvalidArgument, "bad weights"},
		{errors.New("out of memory"), connect.CodeInternal, "out of memory"},
	} {
		e := itemError(tc.err).GetError()
		require.Equal(t, int32(tc.code), e.GetCode(), "%v", tc.err)
		require.Equal(t, tc.msg, e.GetMessage())
	}
}
