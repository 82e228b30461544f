package money

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMoney: USD's decimal form round-trips, and sums overflow loudly.
func TestMoney(t *testing.T) {
	for _, s := range []string{"0", "1", "0.000000000001", "-2.5", "9223372.036854775807", "123.456"} {
		v, err := ParseUSD(s, 12)
		require.NoError(t, err, s)
		require.Equal(t, s, v.String())
	}
	for _, s := range []string{"", ".", "1.2.3", "1e3", "0x10", " 1", "NaN", "9223372.036854775808"} {
		_, err := ParseUSD(s, 12)
		require.Error(t, err, s)
	}
	max, err := ParseUSD("9223372.036854775807", 12)
	require.NoError(t, err)
	_, err = Add(max, 1)
	require.ErrorIs(t, err, ErrOverflow)
	_, err = MulDiv(max, 2, 1)
	require.ErrorIs(t, err, ErrOverflow)
	v, err := MulDiv(3_000_000_000_000, 1, 3600) // $3/h for one second: 0.000833333333|33
	require.NoError(t, err)
	require.Equal(t, "0.000833333333", v.String())
}
