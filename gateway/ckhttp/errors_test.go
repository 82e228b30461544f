package ckhttp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core"
)

// linkErr is a core whose download links all fail with err.
type linkErr struct {
	Checkpoints
	err error
}

func (c linkErr) OpenArchiveLink(context.Context, string) (core.ArchiveLink, error) {
	return core.ArchiveLink{}, c.err
}

// TestErrorsAnswerDetail: an error is answered {"detail"} with loops.v1's status of the
// error table, an internal one masked under an id; a client that went away gets nothing.
func TestErrorsAnswerDetail(t *testing.T) {
	get := func(ctx context.Context, err error) *httptest.ResponseRecorder {
		h := New(linkErr{err: err}, Options{Logger: slog.New(slog.DiscardHandler)})
		rec := httptest.NewRecorder()
		h.Archives().ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "GET", ArchivePrefix+"tok.tar", nil))
		return rec
	}
	rec := get(t.Context(), connect.NewError(connect.CodeNotFound, errors.New("the link has expired")))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.JSONEq(t, `{"detail":"the link has expired"}`, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))

	rec = get(t.Context(), connect.NewError(connect.CodeAlreadyExists, errors.New("exists")))
	require.Equal(t, http.StatusConflict, rec.Code, "loops.v1's status, not Tinker's")

	rec = get(t.Context(), io.ErrUnexpectedEOF)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Regexp(t, `^\{"detail":"internal error, id [0-9a-f]{12}"\}$`, rec.Body.String())

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec = get(ctx, connect.NewError(connect.CodeCanceled, context.Canceled))
	require.Empty(t, rec.Body.String(), "the client went away: nothing is written")
}
