package bounded

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
)

// gzipWorkingSet is what a gzip reader holds besides its output (the 32 KiB window and the
// decoder's tables), reserved along with the output.
const gzipWorkingSet = 64 << 10

// recycledBufferMax is the largest buffer connect-go keeps in its pool for reuse (its
// maxRecycleBufferSize); a reservation is tied to the collection of a larger buffer only.
const recycledBufferMax = 8 << 20

// Gzip decompresses gzip bodies for a reader that pulls the output itself into a buffer it
// grows, as connect-go's Decompressor is used (Reset, Read, Close, with the output read into
// a doubling bytes.Buffer). On the first Read it counts what the body decompresses to,
// keeping none of it: a body over Limit fails there, before the reader has buffered
// anything. Otherwise it reserves in Budget what the reader's buffer can take: four times
// the output for a buffer that doubles (its last size is under twice the output, and the
// smaller ones it outgrew, garbage until collected, add up to less than that). Then it
// streams the output, returning io.EOF with the last byte so the
// reader needs no spare room. At that last Read the reservation is cut to twice the buffer's
// actual size and lasts until that buffer has been garbage collected; Close or the next
// Reset ends a reservation earlier when the body was not read to its end. Read's errors
// are *TooLargeError, *CorruptError or wrap ErrBusy; a wait for the budget is bounded by the
// budget's wait alone (the reader has no request context). A Gzip is used by one goroutine
// at a time.
type Gzip struct {
	// Limit is the most a body may decompress to.
	Limit int64
	// Budget is the server-wide budget; nil grants everything.
	Budget *Budget

	src     io.Reader
	zr      *gzip.Reader
	n, read int64
	hold    *Hold
	err     error
}

// Reset prepares g for a new body read from src.
func (g *Gzip) Reset(src io.Reader) error {
	_ = g.Close()
	g.src, g.zr, g.n, g.read, g.err = src, nil, 0, 0, nil
	return nil
}

// Close ends the body's reservation unless its last Read tied it to the output buffer. It
// never fails.
func (g *Gzip) Close() error {
	g.hold.Release()
	g.hold = nil
	return nil
}

// Read reads decompressed bytes.
func (g *Gzip) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.zr == nil {
		if g.err = g.start(); g.err != nil {
			return 0, g.err
		}
	}
	if g.read == g.n {
		return 0, io.EOF
	}
	before := g.read
	q := p[:min(int64(len(p)), g.n-g.read)]
	m, err := io.ReadFull(g.zr, q)
	g.read += int64(m)
	if err != nil {
		g.err = &CorruptError{Encoding: "gzip", Err: fmt.Errorf("second pass: %w", err)}
		return m, g.err
	}
	if g.read < g.n {
		return m, nil
	}
	// The last bytes: p is the tail of the reader's final buffer, of before+cap(p) bytes.
	if final := before + int64(cap(p)); final > recycledBufferMax {
		g.hold.Shrink(2*final + gzipWorkingSet)
		g.hold.ReleaseWhenCollected(&p[0])
	}
	return m, io.EOF
}

func (g *Gzip) start() error {
	var raw []byte
	if b, ok := g.src.(interface{ Bytes() []byte }); ok {
		raw = b.Bytes()
	} else {
		var err error
		if raw, err = ReadAll(g.src, -1, g.Limit); err != nil {
			return err
		}
	}
	n, err := gzipCount(raw, g.Limit)
	if err != nil {
		return err
	}
	// connect-go's Decompressor has no request context: the budget's own wait bounds this.
	hold, err := g.Budget.Acquire(context.Background(), 4*n+gzipWorkingSet)
	if err != nil {
		return err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		hold.Release()
		return &CorruptError{Encoding: "gzip", Err: err}
	}
	g.zr, g.n, g.hold = zr, n, hold
	return nil
}

// gzipCount returns what raw decompresses to, failing past limit.
func gzipCount(raw []byte, limit int64) (int64, error) {
	if len(raw) == 0 {
		return 0, &CorruptError{Encoding: "gzip", Err: io.ErrUnexpectedEOF}
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return 0, &CorruptError{Encoding: "gzip", Err: err}
	}
	n, err := io.Copy(io.Discard, io.LimitReader(zr, limit+1))
	if n > limit {
		return n, tooLarge(limit)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return n, &CorruptError{Encoding: "gzip", Err: err}
	}
	return n, nil
}
