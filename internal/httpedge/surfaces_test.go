package httpedge_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/compat"
	"github.com/loops-dev/loops/compat/anthropic"
	"github.com/loops-dev/loops/compat/openai"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/httpedge"
)

// panickingModels is a core whose ListModels panics: every surface calls it on one of its
// routes.
type panickingModels struct {
	loopsv1connect.UnimplementedModelServiceHandler
}

func (panickingModels) ListModels(context.Context, *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	panicInCore()
	return nil, nil
}

func panicInCore() { panic("nil map in the core") }

var idPattern = regexp.MustCompile(`internal error, id ([0-9a-f]{12})`)

// TestPanicOnEverySurface: a panic under each surface is answered 500 in that protocol's
// own error shape, with an error id, and logged once with its stack under that id.
func TestPanicOnEverySurface(t *testing.T) {
	for _, tc := range []struct {
		name   string
		make   func(log *slog.Logger) http.Handler
		req    *http.Request
		prefix string
		want   string // the body, %s for the error id
	}{
		{"tinker", func(log *slog.Logger) http.Handler {
			return compat.NewHandler(compat.Services{
				Sessions:    loopsv1connect.UnimplementedSessionServiceHandler{},
				Training:    loopsv1connect.UnimplementedTrainingServiceHandler{},
				Operations:  loopsv1connect.UnimplementedOperationServiceHandler{},
				Checkpoints: loopsv1connect.UnimplementedCheckpointServiceHandler{},
				Sampling:    loopsv1connect.UnimplementedSamplingServiceHandler{},
				Models:      panickingModels{},
				Usage:       loopsv1connect.UnimplementedUsageServiceHandler{},
			}, compat.Options{Logger: log})
		}, httptest.NewRequest("GET", "/api/v1/get_server_capabilities", nil), "compat",
			`{"detail":"internal error, id %s","code":"internal","reason":"INTERNAL"}`},
		{"openai", func(log *slog.Logger) http.Handler {
			return openai.NewHandler(openai.Services{
				Sampling:    loopsv1connect.UnimplementedSamplingServiceHandler{},
				Operations:  loopsv1connect.UnimplementedOperationServiceHandler{},
				Models:      panickingModels{},
				Checkpoints: loopsv1connect.UnimplementedCheckpointServiceHandler{},
			}, openai.Options{Logger: log})
		}, httptest.NewRequest("GET", openai.Prefix+"models", nil), "openai",
			`{"error":{"message":"internal error, id %s","type":"server_error","param":null,"code":"internal"}}`},
		{"anthropic", func(log *slog.Logger) http.Handler {
			return anthropic.NewHandler(anthropic.Services{
				Sampling:   loopsv1connect.UnimplementedSamplingServiceHandler{},
				Operations: loopsv1connect.UnimplementedOperationServiceHandler{},
				Models:     panickingModels{},
			}, anthropic.Options{Logger: log})
		}, httptest.NewRequest("POST", anthropic.Prefix+"v1/messages/count_tokens",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)), "anthropic",
			`{"type":"error","error":{"type":"api_error","message":"internal error, id %s"}}`},
		{"gateway", func(log *slog.Logger) http.Handler {
			// What the gateway puts around every route (gateway.recoverPanics).
			return compat.ErrorSurface("gateway", log).Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panicInCore() }))
		}, httptest.NewRequest("POST", "/loops.v1.ModelService/ListModels", nil), "gateway",
			`{"detail":"internal error, id %s","code":"internal","reason":"INTERNAL"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := httpedge.NewTestLog(t)
			h := tc.make(log)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tc.req)
			require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			m := idPattern.FindStringSubmatch(rec.Body.String())
			require.NotNil(t, m, rec.Body.String())
			id := m[1]
			require.JSONEq(t, strings.ReplaceAll(tc.want, "%s", id), rec.Body.String())

			var panics []map[string]any
			for _, rec := range lines() {
				if _, ok := rec["stack"]; ok {
					panics = append(panics, rec)
				}
			}
			require.Len(t, panics, 1, "the stack is logged once: %v", lines())
			require.Equal(t, tc.prefix+": panic serving request", panics[0]["msg"])
			require.Equal(t, id, panics[0]["error_id"], "logged under the id the client sees")
			require.Equal(t, "nil map in the core", panics[0]["panic"])
			require.Contains(t, panics[0]["stack"], "panicInCore")
		})
	}
}
