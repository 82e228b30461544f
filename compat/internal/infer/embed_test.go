package infer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckDimensions: dimensions is refused only when given and the hidden size is known
// and differs (the size comes from ModelInfo.hidden_size before any work, or from the
// vectors once back).
func TestCheckDimensions(t *testing.T) {
	require.NoError(t, checkDimensions(0, 256, "m"))
	require.NoError(t, checkDimensions(256, 256, "m"))
	require.NoError(t, checkDimensions(8, 0, "m"))
	err := checkDimensions(8, 256, "m")
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, "dimensions", e.Param)
	require.Equal(t, 400, e.Status)
	require.Contains(t, e.Message, "m's hidden size 256")
}
