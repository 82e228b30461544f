package opsvc

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/loops-dev/loops/gateway/auth"
)

// PprofPrefix is where Go's profiles are served, to operators only.
const PprofPrefix = "/debug/pprof/"

// MaxProfileSeconds bounds a CPU profile or an execution trace (?seconds=).
const MaxProfileSeconds = 300

// Pprof serves net/http/pprof's pages to operators (an operator key, or any key from
// loopback in open mode without operator keys: auth.IsOperator) and a plain 404 to
// everyone else, who learns nothing of it. It must sit behind the API key middleware.
func Pprof() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !auth.IsOperator(r.Context()) {
			http.NotFound(w, r)
			return
		}
		if s := r.URL.Query().Get("seconds"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 || n > MaxProfileSeconds {
				http.Error(w, fmt.Sprintf("seconds=%q: give a whole number of seconds from 1 to %d", s, MaxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		switch name := strings.TrimPrefix(r.URL.Path, PprofPrefix); name {
		case "cmdline":
			pprof.Cmdline(w, r)
		case "profile":
			pprof.Profile(w, r)
		case "symbol":
			pprof.Symbol(w, r)
		case "trace":
			pprof.Trace(w, r)
		default: // the index, and the named profiles (heap, goroutine, allocs, block, mutex, …)
			pprof.Index(w, r)
		}
	})
}

// Register adds to mux the health service, /livez and /readyz, server reflection and
// /debug/pprof/. The mux must sit behind the API key middleware, with PublicPaths public.
func Register(mux *http.ServeMux, h *Health) {
	mux.Handle(h.Handler())
	mux.HandleFunc("GET /livez", h.Livez)
	mux.HandleFunc("GET /readyz", h.Readyz)
	for path, handler := range reflectionHandlers() {
		mux.Handle(path, handler)
	}
	mux.Handle(PprofPrefix, Pprof())
}

// ProbePaths are the probes and the health service: asked often, by machines, and left
// out of traces.
var ProbePaths = []string{"/livez", "/readyz", "/grpc.health.v1.Health/"}

// PublicPaths need no API key: the probes, the health service and reflection (whose
// schema /openapi.json publishes already). /debug/pprof/ is not among them.
var PublicPaths = append(slices.Clone(ProbePaths),
	"/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/")
