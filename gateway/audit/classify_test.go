package audit

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/loops-dev/loops/compat"
	_ "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestEveryRouteClassified fails when a Tinker route or a loops.v1 procedure is added
// without a Rule: decide whether it mutates (Mutate, with its event), reads weights
// (Access) or only reads (Read), and add it to Rules.
func TestEveryRouteClassified(t *testing.T) {
	known := map[string]Rule{}
	for _, r := range Rules {
		_, dup := known[r.Pattern]
		require.False(t, dup, "%s is listed twice", r.Pattern)
		known[r.Pattern] = r
		if r.Class.Recorded() {
			require.Regexp(t, `^[a-z]+(_[a-z]+)+$`, r.Event, "%s: a recorded rule names its event <resource>_<verb>", r.Pattern)
		} else {
			require.Empty(t, r.Event, "%s: a read names no event", r.Pattern)
		}
	}
	NewClassifier(Rules) // panics on a pattern net/http refuses or two that conflict

	routes := compat.Routes()
	require.Greater(t, len(routes), 40)
	for _, p := range routes {
		if !strings.Contains(p, " ") { // the catch-all 404 of unknown paths
			continue
		}
		_, ok := known[p]
		require.True(t, ok, "Tinker route %q is not classified in gateway/audit.Rules", p)
	}

	n := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("loops.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				p := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				_, ok := known[p]
				require.True(t, ok, "loops.v1 procedure %q is not classified in gateway/audit.Rules", p)
				n++
			}
		}
		return true
	})
	require.Greater(t, n, 40)
}

func TestClassify(t *testing.T) {
	c := NewClassifier(Rules)
	for _, tc := range []struct {
		method, path string
		class        Class
		event        string
	}{
		{"POST", "/api/v1/create_model", Mutate, "training_run_create"},
		{"POST", "/api/v1/forward", Read, ""},
		{"DELETE", "/api/v1/training_runs/r1/checkpoints/weights/c1", Mutate, "checkpoint_delete"},
		{"GET", "/api/v1/training_runs/r1/checkpoints/weights/c1/archive", Access, "checkpoint_read"},
		{"GET", "/api/v1/sessions/s1", Read, ""},
		{"POST", "/loops.v1.SessionService/CreateSession", Mutate, "session_create"},
		{"GET", "/loops.v1.SessionService/GetSession", Read, ""},
		{"POST", "/loops.v1.CheckpointService/GetCheckpointArchiveURL", Access, "checkpoint_read"},
		{"POST", "/console/checkpoint/delete", Mutate, "checkpoint_delete"},
		{"POST", "/oai/api/v1/chat/completions", Read, ""},
		{"POST", "/oai/api/v1/embeddings", Read, ""},
		// Unknown: a write is recorded, a read is not.
		{"POST", "/api/v1/some_new_route", Mutate, unclassified},
		{"PATCH", "/v1/sessions/s1", Mutate, unclassified},
		{"GET", "/api/v1/some_new_route", Read, ""},
	} {
		r := c.Classify(httptest.NewRequest(tc.method, tc.path, nil))
		require.Equal(t, tc.class, r.Class, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.event, r.Event, "%s %s", tc.method, tc.path)
	}
	require.Equal(t, "training_run", Rule{Event: "training_run_create"}.Resource())
}

func TestSurfaceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/create_model":                   SurfaceTinker,
		"/loops.v1.SessionService/CreateSession": SurfaceConnect,
		"/oai/api/v1/completions":                SurfaceOpenAI,
		"/anthropic/api/v1/messages":             SurfaceAnthropic,
		"/v1/sessions":                           SurfaceREST,
		"/v1/checkpoint_imports":                 SurfaceCheckpoints,
		"/console/checkpoint/delete":             SurfaceConsole,
	} {
		require.Equal(t, want, surfaceOf(path, "application/json"), path)
	}
	require.Equal(t, SurfaceGRPC, surfaceOf("/loops.v1.SessionService/CreateSession", "application/grpc+proto"))
	require.Equal(t, SurfaceGRPCWeb, surfaceOf("/loops.v1.SessionService/CreateSession", "application/grpc-web+proto"))
}

// FuzzClassify: any method and path classifies without panicking; a request no rule matches
// is recorded unless it is a GET, HEAD or OPTIONS, and its recorded action is bounded.
func FuzzClassify(f *testing.F) {
	c := NewClassifier(Rules)
	f.Add("POST", "/api/v1/create_model")
	f.Add("DELETE", "/api/v1/training_runs/a/checkpoints/weights/b")
	f.Add("GET", "/loops.v1.SessionService/GetSession")
	f.Add("PATCH", "/v1/x/../../etc")
	f.Add("POST", "/"+strings.Repeat("a", 1000))
	f.Fuzz(func(t *testing.T, method, path string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Method, r.URL.Path = method, path
		rule := c.Classify(r)
		if rule.Event == unclassified {
			require.NotContains(t, []string{"GET", "HEAD", "OPTIONS"}, method)
			require.LessOrEqual(t, len(rule.Pattern), len(method)+1+256)
		}
		if rule.Class.Recorded() {
			require.NotEmpty(t, rule.Event)
		}
	})
}
