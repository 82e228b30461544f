package money

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// USD is an amount of US dollars in pico-dollars (1e-12 USD).
type USD int64

// Digits is the number of decimal places a USD amount holds.
const Digits = 12

// ErrOverflow is returned when an amount does not fit a USD (about 9.2 million dollars).
var ErrOverflow = errors.New("money: amount overflows (more than 9,223,372 USD)")

// String writes the amount as a decimal number of dollars with no trailing zeros
// ("0.0000025", "12", "-3.5").
func (u USD) String() string {
	neg := u < 0
	// |math.MinInt64| does not fit an int64; go through uint64.
	mag := uint64(u)
	if neg {
		mag = -mag
	}
	s := strconv.FormatUint(mag, 10)
	if len(s) <= Digits {
		s = strings.Repeat("0", Digits-len(s)+1) + s
	}
	whole, frac := s[:len(s)-Digits], strings.TrimRight(s[len(s)-Digits:], "0")
	out := whole
	if frac != "" {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

// ParseUSD parses a decimal amount of dollars ("2.5", "0.000001", "-1") with at most
// maxFrac (at most 12) decimal places.
func ParseUSD(s string, maxFrac int) (USD, error) {
	t := s
	neg := false
	if rest, ok := strings.CutPrefix(t, "-"); ok {
		neg, t = true, rest
	} else {
		t = strings.TrimPrefix(t, "+")
	}
	whole, frac, dot := strings.Cut(t, ".")
	if whole == "" && (!dot || frac == "") || !digits(whole) || !digits(frac) {
		return 0, fmt.Errorf("%q is not a decimal number of dollars such as 2.50", s)
	}
	if len(frac) > maxFrac {
		return 0, fmt.Errorf("%q has more than %d decimal places", s, maxFrac)
	}
	var v uint64
	for _, c := range whole + frac + strings.Repeat("0", Digits-len(frac)) {
		d := uint64(c - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, fmt.Errorf("%q: %w", s, ErrOverflow)
		}
		v = v*10 + d
	}
	if neg {
		return -USD(v), nil
	}
	return USD(v), nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Add returns a+b, or ErrOverflow.
func Add(a, b USD) (USD, error) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, ErrOverflow
	}
	return s, nil
}

// Mul returns u*n for n >= 0, or ErrOverflow.
func Mul(u USD, n int64) (USD, error) {
	if n < 0 {
		return 0, fmt.Errorf("money: negative quantity %d", n)
	}
	if u == 0 || n == 0 {
		return 0, nil
	}
	if u > 0 && n > math.MaxInt64/int64(u) || u < 0 && n > math.MinInt64/int64(u) {
		return 0, ErrOverflow
	}
	return u * USD(n), nil
}

// MulDiv returns u*n/d rounded half up for u, n >= 0 and d > 0, or ErrOverflow. The
// product is exact (128 bits).
func MulDiv(u USD, n, d int64) (USD, error) {
	if u < 0 || n < 0 || d <= 0 {
		return 0, fmt.Errorf("money: MulDiv(%d, %d, %d) out of range", u, n, d)
	}
	hi, lo := bits.Mul64(uint64(u), uint64(n))
	if hi >= uint64(d) {
		return 0, ErrOverflow
	}
	q, r := bits.Div64(hi, lo, uint64(d))
	if r >= uint64(d)-r { // r >= d/2, exactly: round half up
		q++
	}
	if q > math.MaxInt64 {
		return 0, ErrOverflow
	}
	return USD(q), nil
}

// Tally sums amounts of usage and, exactly, the costs of the priced part: the total a
// usage table shows per row. Err is the first cost that did not parse or overflowed the
// sum (the cost is then not summed further; amounts still are).
type Tally struct {
	Amount, Priced int64
	Cost           USD
	Err            error
}

// Add adds amount units whose cost is cost (a decimal of USD, "" when unpriced), priced
// of them priced.
func (t *Tally) Add(amount int64, cost string, priced int64) {
	t.Amount += amount
	if cost == "" || t.Err != nil {
		return
	}
	v, err := ParseUSD(cost, Digits)
	if err == nil {
		v, err = Add(t.Cost, v)
	}
	if err != nil {
		t.Err = fmt.Errorf("summing the cost %q: %w", cost, err)
		return
	}
	t.Cost, t.Priced = v, t.Priced+priced
}

// Text is the tally's cost: unpriced when none of it was priced, the exact USD with "*"
// after it when only part was.
func (t *Tally) Text(unpriced string) string {
	switch {
	case t.Priced == 0:
		return unpriced
	case t.Priced < t.Amount:
		return t.Cost.String() + "*"
	}
	return t.Cost.String()
}
