package httpedge

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatusWriterRecordsTheFirstStatusAndFlushes(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := &StatusWriter{ResponseWriter: rec}
	_, err := sw.Write([]byte("x"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, sw.Status, "a body without a status is a 200")
	sw.WriteHeader(http.StatusTeapot)
	require.Equal(t, http.StatusOK, sw.Status, "the first status stays")

	rec = httptest.NewRecorder()
	sw = &StatusWriter{ResponseWriter: rec}
	sw.WriteHeader(http.StatusNotFound)
	require.Equal(t, http.StatusNotFound, sw.Status)
	var _ http.Flusher = sw
	sw.Flush()
	require.True(t, rec.Flushed, "Flush reaches the underlying writer")
	require.NoError(t, http.NewResponseController(sw).Flush())
}
