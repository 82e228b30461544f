package compat

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/imagefetch"
)

// TestAssetPointerFetched: with --image-fetch-hosts naming an image server, a sample whose
// prompt has an image_asset_pointer chunk reaches the core with the image's bytes fetched
// from it (over TLS, through the real fetcher); without the option the same request is a
// 400 that says how to send the image, and the image server is never asked.
func TestAssetPointerFetched(t *testing.T) {
	pic := testPNG(t, 48, 40)
	asked := 0
	img := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { asked++; _, _ = w.Write(pic) }))
	t.Cleanup(img.Close)
	fetcher, err := imagefetch.New(imagefetch.Options{Hosts: []string{strings.TrimPrefix(img.URL, "https://")}, Client: img.Client()})
	require.NoError(t, err)

	body := func(smp string) string {
		return fmt.Sprintf(`{"num_samples":1,"prompt":{"chunks":[{"tokens":[1,2],"type":"encoded_text"},
			{"type":"image_asset_pointer","location":%q,"format":"png","expected_tokens":4}]},
			"sampling_params":{"max_tokens":2},"sampling_session_id":%q}`, img.URL+"/cat.png", smp)
	}
	session := func(e *testEnv) string {
		sid := e.postJSON("/api/v1/create_session", `{}`).json(t)["session_id"].(string)
		return e.postJSON("/api/v1/create_sampling_session", fmt.Sprintf(`{"session_id":%q,"base_model":"Qwen/Qwen3-VL-8B"}`, sid)).json(t)["sampling_session_id"].(string)
	}

	e := newEnv(t, func(o *Options) { o.ImageFetcher = fetcher })
	r := e.postJSON("/api/v1/asample", body(session(e)))
	require.Equal(t, 200, r.status, string(r.body))
	got := e.core.lastReq("Sample").(*loopsv1.SampleRequest)
	require.Equal(t, []int32{1, 2, 0, 0, 0, 0}, got.GetPrompt())
	require.Len(t, got.GetPromptImages(), 1)
	require.Equal(t, pic, got.GetPromptImages()[0].GetData())
	require.Equal(t, 1, asked)

	plain := newEnv(t)
	r = plain.postJSON("/api/v1/asample", body(session(plain)))
	require.Equal(t, 400, r.status, string(r.body))
	require.Contains(t, string(r.body), "this server fetches no images")
	require.Equal(t, 1, asked)
}
