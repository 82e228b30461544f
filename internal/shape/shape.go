// Package shape checks tensor shapes that arrive from the wire: every dimension is
// non-negative and the element count fits a limit, computed without overflow. Every
// surface and backend that turns a shape into an allocation or an index goes through it.
package shape

import (
	"fmt"
	"math"
)

// Elements returns the number of elements of a tensor with the given dimensions, or an
// error when a dimension is negative or the count exceeds limit (a limit ≤ 0 means
// math.MaxInt64). The product is checked before each multiplication, so dimensions that
// would wrap int64 (e.g. [4, 4611686018427387905]) are refused rather than accepted as 4.
// An empty shape has one element (a scalar).
func Elements(dims []int64, limit int64) (int64, error) {
	if limit <= 0 {
		limit = math.MaxInt64
	}
	n := int64(1)
	for _, d := range dims {
		if d < 0 {
			return 0, fmt.Errorf("shape %v has a negative dimension", dims)
		}
		if d != 0 && n > limit/d {
			return 0, fmt.Errorf("shape %v has more than %d elements, the server's limit", dims, limit)
		}
		n *= d
	}
	return n, nil
}

// Matches checks that dims describes exactly count elements, with every dimension at
// least 1. It is the check for a dense tensor that carries its values.
func Matches(dims []int64, count int) error {
	for _, d := range dims {
		if d < 1 {
			return fmt.Errorf("shape %v has a dimension of %d: every dimension must be at least 1", dims, d)
		}
	}
	n, err := Elements(dims, int64(count))
	if err != nil {
		return fmt.Errorf("shape %v needs more elements than the tensor's %d values", dims, count)
	}
	if n != int64(count) {
		return fmt.Errorf("shape %v needs %d elements but the tensor has %d", dims, n, count)
	}
	return nil
}
