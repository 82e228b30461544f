package infer

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/loops-dev/loops/internal/bounded"
	"github.com/loops-dev/loops/internal/errs"
)

// ReadBody reads a request's whole body within max bytes. A compressed body, one that does
// not arrive in time or cannot be read is an *Error; one over max is the
// *http.MaxBytesError, which each adapter answers as its protocol's 413.
func ReadBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc != "" && enc != "identity" {
		return nil, &Error{Status: http.StatusUnsupportedMediaType, Code: strings.ToLower(errs.ReasonUnsupportedEncoding),
			Message: fmt.Sprintf("Content-Encoding %q is not supported; send the body uncompressed", enc)}
	}
	b, err := bounded.ReadAll(http.MaxBytesReader(w, r.Body, max), r.ContentLength, max)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &Error{Status: http.StatusRequestTimeout, Code: strings.ToLower(errs.ReasonBodyReadTimeout),
				Message: "the request body did not arrive within the server's body read timeout"}
		}
		return nil, &Error{Status: http.StatusBadRequest, Code: "invalid_body", Message: fmt.Sprintf("cannot read the request body: %v", err)}
	}
	return b, nil
}
