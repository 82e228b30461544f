package httpedge

import "net/http"

// StatusWriter records the status a handler writes (200 once it writes a body without
// one); Unwrap keeps http.ResponseController (deadlines, flushes) working through it, and
// Flush keeps a streaming handler's http.Flusher assertion working.
type StatusWriter struct {
	http.ResponseWriter
	// Status is the status written, 0 while none is.
	Status int
}

// WriteHeader records the first status and passes it on.
func (s *StatusWriter) WriteHeader(code int) {
	if s.Status == 0 {
		s.Status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write records 200 when no status was written first.
func (s *StatusWriter) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush flushes the underlying writer when it can.
func (s *StatusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the underlying writer (for http.ResponseController).
func (s *StatusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
