package bounded

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// TooLargeError reports a body that decompresses (or would need a window) past a limit.
type TooLargeError struct {
	// Limit is the limit in bytes that was exceeded.
	Limit int64
	// Reason says what exceeded it.
	Reason string
}

func (e *TooLargeError) Error() string { return e.Reason }

// CorruptError reports a body that is not valid in its Content-Encoding.
type CorruptError struct {
	// Encoding is the Content-Encoding, e.g. "zstd".
	Encoding string
	// Err is the decoder's error.
	Err error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("the body is not valid %s: %v", e.Encoding, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// ErrBusy is returned when the Budget had no room for a body within its wait.
var ErrBusy = errors.New("the server is decompressing other request bodies and had no room for this one in time; retry shortly")

// ReadAll reads r to its end into one buffer of at most limit bytes. size is the expected
// length (a request's ContentLength, -1 when unknown): when it is known the buffer is
// allocated once at that size; otherwise it grows by doubling but never past limit+1 bytes.
// More than limit bytes is a *http.MaxBytesError; other read errors are returned as they are.
func ReadAll(r io.Reader, size, limit int64) ([]byte, error) {
	if size > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	c := size + 1 // one spare byte, so that reading EOF needs no growth
	if size < 0 {
		c = min(limit+1, 64<<10)
	}
	buf := make([]byte, 0, c)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return nil, &http.MaxBytesError{Limit: limit}
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), limit+1))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, &http.MaxBytesError{Limit: limit}
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
