package ckhttp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/errs"
)

func TestSlotsShareTheServerBetweenWorkspaces(t *testing.T) {
	s := newSlots("imports", "max_concurrent_imports", "max_imports_per_workspace", 3, 2, 5*time.Second)
	a1, err := s.acquire("a")
	require.NoError(t, err)
	_, err = s.acquire("a")
	require.NoError(t, err)
	_, err = s.acquire("a")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.ErrorContains(t, err, "max_imports_per_workspace = 2")
	d, ok := errs.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, 5*time.Second, d)
	b1, err := s.acquire("b")
	require.NoError(t, err, "workspace a holds its share only")
	_, err = s.acquire("c")
	require.ErrorContains(t, err, "max_concurrent_imports")
	a1()
	a1() // a second release does nothing
	_, err = s.acquire("c")
	require.NoError(t, err)
	_, err = s.acquire("b")
	require.ErrorContains(t, err, "max_concurrent_imports")
	b1()
	require.Equal(t, map[string]int{"a": 1, "c": 1}, s.per, "only workspaces with transfers running are held")
}

func TestOptionsShareDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	require.Equal(t, 1, o.MaxExportsPerWorkspace)
	require.Equal(t, 1, o.MaxImportsPerWorkspace)
	o = Options{MaxImports: 8, MaxExports: 3, MaxExportsPerWorkspace: 9}.withDefaults()
	require.Equal(t, 4, o.MaxImportsPerWorkspace)
	require.Equal(t, 3, o.MaxExportsPerWorkspace, "a share is at most the whole")
}

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestMinRateMovesTheDeadlineWithProgress(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	var set []time.Time
	m := &minRate{set: func(d time.Time) error { set = append(set, d); return nil }, now: c.now,
		rate: 100, window: 10 * time.Second, quota: 1000, end: c.t.Add(25 * time.Second)}
	m.start = c.now()
	m.extend(m.start)
	require.Equal(t, []time.Time{c.t.Add(10 * time.Second)}, set)
	c.t = c.t.Add(4 * time.Second)
	m.add(999)
	require.Len(t, set, 1, "under the quota: the deadline stays")
	m.add(1)
	require.Equal(t, c.t.Add(10*time.Second), set[1], "the quota moved: window from now")
	c.t = c.t.Add(14 * time.Second)
	m.add(1000)
	require.Equal(t, time.Unix(1025, 0), set[2], "never past the end")

	// A read cut by the deadline reports why.
	timeout := fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded)
	err := m.cut(timeout, "the import")
	var cut *cutError
	require.ErrorAs(t, err, &cut)
	require.Contains(t, cut.msg, "fewer than 100 bytes/s over 10s")
	require.NotContains(t, cut.msg, "i/o timeout")
	c.t = time.Unix(1025, 0)
	require.Contains(t, m.cut(timeout, "the import").Error(), "cut after 25s, the longest it may take")
	other := errors.New("connection reset")
	require.Equal(t, other, m.cut(other, "the import"))

	m.stop()
	require.True(t, set[len(set)-1].IsZero(), "stopped: the deadline is cleared")
	n := len(set)
	m.add(5000)
	require.Len(t, set, n, "a stopped meter sets nothing")
}

func TestRateReaderClearsTheDeadlineAtTheEnd(t *testing.T) {
	var last time.Time
	m := newMinRate(func(d time.Time) error { last = d; return nil }, 1, time.Minute, time.Time{})
	require.False(t, last.IsZero())
	b, err := io.ReadAll(&rateReader{r: strings.NewReader("hello"), m: m, what: "the import"})
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	require.True(t, last.IsZero())
}

func TestMinRateWithoutDeadlinesIsOff(t *testing.T) {
	calls := 0
	m := newMinRate(func(time.Time) error { calls++; return errors.New("not supported") }, 1, time.Second, time.Time{})
	m.add(100)
	m.stop()
	require.Equal(t, 1, calls)
}
