package compat

import (
	"net/http"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// traceExport answers the SDK's trace_export poll: the trace is built when its link is
// fetched, so it is ready at once ({"status":"ready","url"}); the SDK (and `tinker session
// export-trace`) then downloads the link without an API key. The trace is Chrome trace
// event JSON, which Perfetto opens whatever the file's extension (.pftrace included).
func (s *server) traceExport(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Traces == nil {
		return notImplemented("trace_export is not supported by this server")
	}
	res, err := s.svc.Traces.GetSessionTraceURL(r.Context(), &loopsv1.GetSessionTraceURLRequest{SessionId: r.PathValue("id")})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready", "url": absoluteURL(r, res.GetUrl())})
	return nil
}
