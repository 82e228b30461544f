package gateway

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/internal/bounded"
)

// DefaultBodyReadTimeout is how long a request body has to arrive, counted from the end of
// its headers, unless configured otherwise: 60 s, a 64 MiB body at about 1.1 MB/s. A stalled
// body is cut off then (HTTP/1.1 and HTTP/2 alike); responses, long-polls included, are not
// limited by it.
const DefaultBodyReadTimeout = 60 * time.Second

// idleTimeout closes a keep-alive connection with no request in flight.
const idleTimeout = 2 * time.Minute

// withBodyReadDeadline gives each request body timeout to arrive. The deadline is set on
// the request's own stream through http.ResponseController (a per-connection deadline for
// HTTP/1.1, a per-stream one for HTTP/2) and cleared once the body has been read to its
// end, so that a handler answering slowly (a long-poll, a download) is never cut off by it:
// unlike http.Server.ReadTimeout, which stays set on an HTTP/1.1 connection and cancels the
// request's context when it passes.
func withBodyReadDeadline(timeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(timeout)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline when the body has been read to its end.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// withBoundedGzip replaces connect-go's gzip decompressor (which buffers into a doubling
// bytes.Buffer up to the read limit and then inflates the rest of a bomb to report its size)
// with bounded.Gzip: it counts the output first, fails a body over limit before anything
// is buffered, and reserves the body's size in the server's decompression budget while it
// is decompressed. Responses are still gzip-compressed by the standard library.
func withBoundedGzip(limit int64, budget *bounded.Budget) connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithCompression("gzip", nil, nil), // drop the default, not to list gzip twice
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &connectGzip{bounded.Gzip{Limit: limit, Budget: budget}} },
			func() connect.Compressor { return gzip.NewWriter(io.Discard) },
		),
	)
}

// connectGzip turns bounded.Gzip's errors into Connect errors, which connect-go passes on
// as they are: over the limit and a full budget are ResourceExhausted (HTTP 429, as
// connect-go answers a message over its read limit), a corrupt body InvalidArgument.
type connectGzip struct{ bounded.Gzip }

func (g *connectGzip) Read(p []byte) (int, error) {
	n, err := g.Gzip.Read(p)
	if err == nil || errors.Is(err, io.EOF) {
		return n, err
	}
	var tl *bounded.TooLargeError
	if errors.As(err, &tl) || errors.Is(err, bounded.ErrBusy) {
		return n, connect.NewError(connect.CodeResourceExhausted, err)
	}
	return n, connect.NewError(connect.CodeInvalidArgument, err)
}
