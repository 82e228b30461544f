package gateway

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/httpedge"
)

// traceDetail is the JSON body of a trace link's error answer.
type traceDetail struct {
	Detail string `json:"detail"`
}

// registerTraceLinks serves the session trace links the core issues (core.TracePathPrefix +
// token + ".json", TraceService.GetSessionTraceURL, Tinker's trace_export): the trace, built
// now, as a JSON download. The token is the credential: the path is public.
func registerTraceLinks(mux *http.ServeMux, c *core.Core, log *slog.Logger) {
	edge := &httpedge.Surface{Name: "traces", Logger: log, Classify: func(err error) httpedge.Answer {
		out, msg := httpedge.Public(err)
		return httpedge.Answer{Status: out.Entry.HTTPStatus, Body: traceDetail{msg}, ID: out.ID, Reason: errs.Reason(out.Err), Message: msg}
	}, EncodeFailure: []byte(`{"detail":"internal error: cannot encode the response"}`)}
	edge.Handle(mux, "GET "+core.TracePathPrefix+"{token}", func(w http.ResponseWriter, r *http.Request) error {
		session, b, err := c.TraceDownload(r.Context(), r.PathValue("token"))
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Header().Set("Content-Disposition", `attachment; filename="`+session+`.json"`)
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
		return nil
	})
}
