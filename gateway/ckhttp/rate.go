package ckhttp

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// minRate enforces a minimum transfer rate on one direction of a request's stream through
// its deadline (http.ResponseController's SetReadDeadline or SetWriteDeadline, which
// HTTP/1.1 sets on the connection and HTTP/2 on the stream alone): the deadline is always
// at most window ahead, and it moves on, to window from then, each time quota more bytes
// (rate × window) have moved. A transfer that moves fewer than quota bytes in window
// reaches its deadline and its I/O fails, which cuts it. end, when set, is a deadline the
// transfer never passes.
type minRate struct {
	set      func(time.Time) error
	now      func() time.Time
	rate     int64
	window   time.Duration
	quota    int64
	end      time.Time
	moved    int64 // since the deadline last moved
	total    int64
	start    time.Time
	deadline time.Time
	off      bool // the stream takes no deadlines, or the transfer is done
}

// newMinRate starts enforcing rate over window on the stream whose deadline set sets.
func newMinRate(set func(time.Time) error, rate int64, window time.Duration, end time.Time) *minRate {
	m := &minRate{set: set, now: time.Now, rate: rate, window: window, end: end,
		quota: max(1, int64(math.Min(float64(rate)*window.Seconds(), math.MaxInt64/2)))}
	m.start = m.now()
	m.extend(m.start)
	return m
}

// extend moves the deadline to window from now (never past end).
func (m *minRate) extend(now time.Time) {
	if m.off {
		return
	}
	d := now.Add(m.window)
	if !m.end.IsZero() && d.After(m.end) {
		d = m.end
	}
	m.deadline = d
	if err := m.set(d); err != nil {
		m.off = true // a stream without deadlines: nothing to enforce with
	}
}

// moved counts n bytes moved.
func (m *minRate) add(n int) {
	m.total += int64(n)
	if m.moved += int64(n); m.moved >= m.quota {
		m.moved = 0
		m.extend(m.now())
	}
}

// stop clears the deadline: the transfer is done.
func (m *minRate) stop() {
	if !m.off {
		m.off = true
		_ = m.set(time.Time{})
	}
}

// cut returns the error to report for err, an I/O error of the transfer: a *cutError when
// the deadline cut it, saying why, and err otherwise.
func (m *minRate) cut(err error, what string) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	took := m.now().Sub(m.start).Round(time.Second)
	if !m.end.IsZero() && !m.now().Before(m.end) {
		return &cutError{msg: fmt.Sprintf("%s was cut after %s, the longest it may take (%d bytes had moved)",
			what, m.end.Sub(m.start).Round(time.Second), m.total)}
	}
	return &cutError{msg: fmt.Sprintf("%s was cut: it moved fewer than %d bytes/s over %s, the slowest a transfer may be (%d bytes in %s); "+
		"send it over a faster connection", what, m.rate, m.window, m.total, took)}
}

// cutError is a transfer cut by its deadline (minRate.cut).
type cutError struct{ msg string }

func (e *cutError) Error() string { return e.msg }

// rateReader reads a request body under a minRate: a read cut by the deadline fails with a
// *cutError, and the deadline is cleared at the end of the body.
type rateReader struct {
	r    io.Reader
	m    *minRate
	what string
}

func (r *rateReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.m.add(n)
	switch {
	case errors.Is(err, io.EOF):
		r.m.stop()
	case err != nil:
		err = r.m.cut(err, r.what)
	}
	return n, err
}

// rateWriter writes a response under a minRate: a write cut by the deadline fails with a
// *cutError.
type rateWriter struct {
	w    io.Writer
	m    *minRate
	what string
}

func (w *rateWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.m.add(n)
	if err != nil {
		err = w.m.cut(err, w.what)
	}
	return n, err
}
