package poolstest

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/mtls"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// CheckStrangers checks that the worker at addr, of pool, whose credentials a issued,
// serves the gateway and nobody else. The gateway creates an adapter; then each stranger
// (a client without a certificate, with another gateway's, with a worker's own, a
// plaintext HTTP/2 and a plaintext HTTP/1.1 client) tries to read the worker's
// capabilities, save the adapter into dir (a folder the worker may use) and delete it: every
// call fails, nothing is written and the adapter is still there. A gateway that dials the
// worker as a worker of another pool, or whose authority did not issue the worker's
// certificate, sends it nothing. The worker must serve a model that takes a rank-2 LoRA.
func CheckStrangers(t *testing.T, a *mtls.Authority, pool, addr, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	gw := clientsOf(t, mtls.HTTPClient(a.DialConfig(pool)), "https://"+addr)
	caps, err := gw.tc.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err, "the gateway is served")
	require.NotEmpty(t, caps.GetModels())
	const victim = "victim"
	_, err = gw.tc.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: victim, BaseModel: caps.GetModels()[0].GetName(),
		Lora: &loopsv1.LoraConfig{Rank: 2, Seed: 1, TrainAttn: true}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = gw.tc.DeleteAdapter(context.Background(), &backendv1.DeleteAdapterRequest{AdapterId: victim})
	})

	other, err := mtls.Open(filepath.Join(t.TempDir(), "other-gateway"))
	require.NoError(t, err)
	own, err := a.Issue(pool, 0)
	require.NoError(t, err)
	ownPair, err := tls.X509KeyPair(own.CertPEM, own.KeyPEM)
	require.NoError(t, err)
	trustAll := func(certs ...tls.Certificate) *http.Client { // a stranger that trusts any server
		return mtls.HTTPClient(&tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, Certificates: certs}) //nolint:gosec // a stranger's client
	}
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	strangers := []struct {
		name string
		c    clients
	}{
		{"no client certificate", clientsOf(t, trustAll(), "https://"+addr)},
		{"another gateway's certificate", clientsOf(t, trustAll(other.DialConfig(pool).Certificates...), "https://"+addr)},
		{"the worker's own certificate", clientsOf(t, trustAll(ownPair), "https://"+addr)},
		{"plaintext HTTP/2", clientsOf(t, &http.Client{Transport: &http.Transport{Protocols: h2c}}, "http://"+addr)},
		{"plaintext HTTP/1.1 (Connect)", clientsOf(t, &http.Client{}, "http://"+addr, connect.WithProtoJSON())},
	}
	saveTo := filepath.Join(dir, "stolen")
	for _, s := range strangers {
		_, err := s.c.tc.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
		require.Error(t, err, "%s: capabilities", s.name)
		_, err = s.c.tc.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: victim, Dir: saveTo, IncludeOptimizer: true})
		require.Error(t, err, "%s: save", s.name)
		_, err = s.c.sc.Sample(ctx, &backendv1.SampleRequest{BaseModel: caps.GetModels()[0].GetName(), Prompt: []int32{1, 2}, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1}})
		require.Error(t, err, "%s: sample", s.name)
		_, err = s.c.tc.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: victim})
		require.Error(t, err, "%s: delete", s.name)
		_, err = os.Stat(saveTo)
		require.ErrorIs(t, err, os.ErrNotExist, "%s: nothing was written", s.name)
	}
	// the gateway refuses a worker that is not the one it dials
	for name, cfg := range map[string]*tls.Config{"as a worker of another pool": a.DialConfig(pool + "-other"), "from another gateway": other.DialConfig(pool)} {
		_, err := clientsOf(t, mtls.HTTPClient(cfg), "https://"+addr).tc.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
		require.Error(t, err, "a gateway dialling the worker %s", name)
	}
	// the adapter is intact: the gateway saves it
	mine := filepath.Join(dir, "mine")
	_, err = gw.tc.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: victim, Dir: mine})
	require.NoError(t, err, "the adapter survived the strangers")
	_, err = os.Stat(filepath.Join(mine, "adapter_config.json"))
	require.NoError(t, err)
}

type clients struct {
	tc backendv1connect.TrainerServiceClient
	sc backendv1connect.SamplerServiceClient
}

func clientsOf(t *testing.T, hc *http.Client, url string, opts ...connect.ClientOption) clients {
	t.Cleanup(hc.CloseIdleConnections)
	if len(opts) == 0 {
		opts = []connect.ClientOption{connect.WithGRPC()}
	}
	return clients{tc: backendv1connect.NewTrainerServiceClient(hc, url, opts...), sc: backendv1connect.NewSamplerServiceClient(hc, url, opts...)}
}
