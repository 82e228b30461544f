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

// TestTally: amounts all add up, the priced part's costs exactly; the text marks a partly
// priced tally with "*" and an unpriced one with the caller's placeholder; a cost that does
// not parse stops the cost sum with an error naming it.
func TestTally(t *testing.T) {
	var tl Tally
	require.Equal(t, "-", tl.Text("-"))
	tl.Add(10, "0.0000025", 10)
	tl.Add(5, "0.0000005", 5)
	require.Equal(t, "0.000003", tl.Text("-"))
	tl.Add(7, "", 0)
	require.Equal(t, int64(22), tl.Amount)
	require.Equal(t, "0.000003*", tl.Text("-"))
	tl.Add(1, "x", 1)
	require.ErrorContains(t, tl.Err, `summing the cost "x"`)
	tl.Add(1, "1", 1)
	require.Equal(t, int64(24), tl.Amount)
	require.Equal(t, "0.000003", tl.Cost.String())
}
