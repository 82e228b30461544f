package shape

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestElements(t *testing.T) {
	for _, tc := range []struct {
		dims  []int64
		limit int64
		want  int64
		err   bool
	}{
		{dims: nil, want: 1},
		{dims: []int64{3, 4}, want: 12},
		{dims: []int64{3, 0}, want: 0},
		{dims: []int64{3, -1}, err: true},
		{dims: []int64{3, 4}, limit: 11, err: true},
		{dims: []int64{3, 4}, limit: 12, want: 12},
		// 4 × (2^62+1) wraps int64 to 4: the overflow must be caught, not accepted.
		{dims: []int64{4, 4611686018427387905}, err: true},
		{dims: []int64{math.MaxInt64, 2}, err: true},
		{dims: []int64{1 << 32, 1 << 32}, err: true},
		{dims: []int64{0, math.MaxInt64, math.MaxInt64}, want: 0},
		{dims: []int64{math.MaxInt64}, want: math.MaxInt64},
	} {
		got, err := Elements(tc.dims, tc.limit)
		if tc.err {
			require.Error(t, err, "dims %v", tc.dims)
			continue
		}
		require.NoError(t, err, "dims %v", tc.dims)
		require.Equal(t, tc.want, got, "dims %v", tc.dims)
	}
}

func TestMatches(t *testing.T) {
	require.NoError(t, Matches([]int64{4}, 4))
	require.NoError(t, Matches([]int64{2, 2}, 4))
	require.ErrorContains(t, Matches([]int64{4, 4611686018427387905}, 4), "needs more elements than the tensor's 4 values")
	require.ErrorContains(t, Matches([]int64{4, 0}, 0), "dimension of 0")
	require.ErrorContains(t, Matches([]int64{2, 3}, 4), "needs more elements")
	require.ErrorContains(t, Matches([]int64{2, 1}, 4), "needs 2 elements but the tensor has 4")
	require.ErrorContains(t, Matches([]int64{-2, -2}, 4), "dimension of -2")
}

func FuzzElements(f *testing.F) {
	f.Add(int64(4), int64(4611686018427387905), int64(0))
	f.Add(int64(1<<31), int64(1<<33), int64(100))
	f.Fuzz(func(t *testing.T, a, b, limit int64) {
		n, err := Elements([]int64{a, b}, limit)
		if err != nil {
			return
		}
		// Independent check in float64 (exact enough to detect any wrap).
		require.GreaterOrEqual(t, n, int64(0))
		if a != 0 && b != 0 {
			require.Equal(t, a, n/b)
			require.InDelta(t, float64(a)*float64(b), float64(n), math.Abs(float64(a)*float64(b))*1e-9)
		}
	})
}
