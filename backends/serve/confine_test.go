package serve

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestConfinement: the folders a request names must be inside the worker's --allow-dir
// folders, symbolic links resolved, and its URLs of the checkpoint store: a save, a load or
// a sample that names anything else is refused with InvalidArgument before the engine
// runs, and nothing is written; inside, everything works.
func TestConfinement(t *testing.T) {
	eo, _ := engineOptions(t)
	g := newGateway(t)
	root := filepath.Join(g.dir, "allowed")
	outside := t.TempDir()
	require.NoError(t, os.MkdirAll(root, 0o700))
	r := start(t, g, Options{Engine: eo, AllowDirs: []string{root}, CheckpointOrigins: []string{"https://store.example:9000"}})
	hc := g.client(t)
	tc := backendv1connect.NewTrainerServiceClient(hc, "https://"+r.addr, connect.WithGRPC())
	sc := backendv1connect.NewSamplerServiceClient(hc, "https://"+r.addr, connect.WithGRPC())
	ctx := t.Context()
	_, err := tc.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, Seed: 1, TrainAttn: true}})
	require.NoError(t, err)
	good := filepath.Join(root, "ck")
	_, err = tc.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: good, IncludeOptimizer: true})
	require.NoError(t, err, "inside the allowed folder")

	// links inside the allowed folder that lead out of it
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "escape")))
	planted := filepath.Join(root, "planted")
	require.NoError(t, os.MkdirAll(planted, 0o700))
	secret := filepath.Join(outside, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("owner's file"), 0o600))
	require.NoError(t, os.Symlink(secret, filepath.Join(planted, "adapter_model.safetensors")))

	for _, dir := range []string{
		filepath.Join(outside, "ck"), // outside
		"ck",                         // relative
		root + "/../" + filepath.Base(outside) + "/ck", // ..
		filepath.Join(root, "escape", "ck"),            // through a link
		planted,                                        // holding a link out
		root + "/ck\x00/x",                             // NUL
		"/" + strings.Repeat("a/", 3000),               // too long
	} {
		_, err := tc.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: dir})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "save to %q: %v", dir, err)
		require.NotContains(t, err.Error(), outside, "the error names no path")
		_, err = tc.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "b", Dir: dir})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "load from %q: %v", dir, err)
		req := &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: []int32{1, 2}, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1}}
		_, err = sc.Sample(ctx, req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "sample from %q: %v", dir, err)
		st, err := sc.StreamSample(ctx, &backendv1.StreamSampleRequest{Request: req})
		require.NoError(t, err)
		for st.Receive() {
		}
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(st.Err()), "stream-sample from %q", dir)
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing written outside")
	b, err := os.ReadFile(secret)
	require.NoError(t, err)
	require.Equal(t, "owner's file", string(b))

	// URLs: only the checkpoint store's origin
	for _, u := range []string{"https://elsewhere.example:9000/b/k", "http://store.example:9000/b/k", "https://store.example/b/k",
		"https://user@store.example:9000/b/k", "file:///etc/passwd", "gopher://store.example:9000/"} {
		files := []*backendv1.FileURL{{Name: "adapter_model.safetensors", Url: u, Size: 1, Sha256: strings.Repeat("0", 64)}}
		_, err := tc.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "b", Download: files})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "download from %s", u)
		_, err = tc.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Upload: files})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "upload to %s", u)
		_, err = sc.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterFiles: files, Prompt: []int32{1}, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1}})
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "sample from %s", u)
	}

	// inside: load and sample the saved adapter
	_, err = tc.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "b", Dir: good, LoadOptimizer: true})
	require.NoError(t, err)
	_, err = sc.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: good, Prompt: []int32{1, 2}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1}})
	require.NoError(t, err)
}

// TestNoFoldersNoURLs: a worker started without --allow-dir or --checkpoint-origin takes
// no folder and no URL, and says how to give it some.
func TestNoFoldersNoURLs(t *testing.T) {
	c, err := newConfinement(nil, nil)
	require.NoError(t, err)
	require.ErrorContains(t, c.dir("dir", "/tmp/x"), "--allow-dir")
	require.ErrorContains(t, c.url("download", "https://s3.example/x"), "--checkpoint-origin")
	require.NoError(t, c.dir("dir", ""), "no folder named: nothing to check")
}

// FuzzConfinement: any folder a request names is refused or resolves inside the allowed
// folder; any URL is refused or has the store's origin; never a panic.
func FuzzConfinement(f *testing.F) {
	root := f.TempDir()
	require.NoError(f, os.MkdirAll(filepath.Join(root, "a", "b"), 0o700))
	require.NoError(f, os.Symlink("/", filepath.Join(root, "a", "up")))
	c, err := newConfinement([]string{root}, []string{"https://store.example:9000"})
	require.NoError(f, err)
	for _, s := range []string{root, root + "/a/b/c", root + "/a/up/etc", root + "/../x", "/etc", "", "a/b", root + "//a/./b",
		"https://store.example:9000/x", "https://store.example:9000@evil/x", "https://evil/?https://store.example:9000", "http://[::1]:9000/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := c.dir("dir", s); err == nil && s != "" {
			real, err := resolve(filepath.Clean(s))
			require.NoError(t, err)
			require.True(t, real == c.roots[0] || strings.HasPrefix(real, c.roots[0]+"/"), "%q resolves to %q, outside %q", s, real, c.roots[0])
		}
		if err := c.url("u", s); err == nil && s != "" {
			u, err := url.Parse(s)
			require.NoError(t, err)
			require.Equal(t, origin{"https", "store.example", "9000"}, originOf(u))
			require.Nil(t, u.User)
		}
	})
}
