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

// Gzip decompresses gzip bodies for a reader that pulls the output itself, as connect-go's
// Decompressor does (Reset, Read, Close). On the first Read it counts what the body
// decompresses to, without keeping any of it: a body over Limit fails there, before the
// caller has buffered anything; otherwise it reserves that many bytes in Budget, then
// streams them, returning io.EOF with the last byte so the caller needs no spare room.
// The reservation is released by Close or the next Reset. Read's errors are
// *TooLargeError, *CorruptError or ErrBusy; a wait for the budget is bounded by the
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
	release func()
	err     error
}

// Reset prepares g for a new body read from src.
func (g *Gzip) Reset(src io.Reader) error {
	g.Close()
	g.src, g.zr, g.n, g.read, g.err = src, nil, 0, 0, nil
	return nil
}

// Close releases the body's reservation. It never fails.
func (g *Gzip) Close() error {
	if g.release != nil {
		g.release()
		g.release = nil
	}
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
	p = p[:min(int64(len(p)), g.n-g.read)]
	m, err := io.ReadFull(g.zr, p)
	g.read += int64(m)
	if err != nil {
		g.err = &CorruptError{Encoding: "gzip", Err: fmt.Errorf("second pass: %w", err)}
		return m, g.err
	}
	if g.read == g.n {
		return m, io.EOF
	}
	return m, nil
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
	release, err := g.Budget.Acquire(context.Background(), n+gzipWorkingSet)
	if err != nil {
		return err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		release()
		return &CorruptError{Encoding: "gzip", Err: err}
	}
	g.zr, g.n, g.release = zr, n, release
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
