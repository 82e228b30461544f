package mtls

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// serveTLS serves "ok" with cfg on loopback and returns its address.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	p := new(http.Protocols)
	p.SetHTTP2(true)
	p.SetHTTP1(true)
	srv := &http.Server{Protocols: p, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

func get(t *testing.T, cfg *tls.Config, addr string) error {
	t.Helper()
	hc := HTTPClient(cfg)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "ok", string(b))
	return nil
}

// TestMutualTLS: the gateway and a worker of its pool talk; every other pairing gets
// nothing: a worker of another pool or another gateway's worker (the gateway refuses it),
// a client without a certificate, with another gateway's certificate, or with a worker's
// own certificate, and a plaintext client (the worker refuses them).
func TestMutualTLS(t *testing.T) {
	a, err := Open(filepath.Join(t.TempDir(), "tls"))
	require.NoError(t, err)
	other, err := Open(filepath.Join(t.TempDir(), "tls"))
	require.NoError(t, err)
	creds, err := a.Issue("pool-a", 0)
	require.NoError(t, err)
	require.Equal(t, "pool-a", creds.Pool)
	scfg, err := creds.ServerConfig()
	require.NoError(t, err)
	worker := serveTLS(t, scfg)

	require.NoError(t, get(t, a.DialConfig("pool-a"), worker), "the gateway and its worker")
	require.ErrorContains(t, get(t, a.DialConfig("pool-b"), worker), `for pool "pool-a", not "pool-b"`, "a worker of another pool")

	otherCreds, err := other.Issue("pool-a", 0)
	require.NoError(t, err)
	ocfg, err := otherCreds.ServerConfig()
	require.NoError(t, err)
	require.ErrorContains(t, get(t, a.DialConfig("pool-a"), serveTLS(t, ocfg)), "not issued by this gateway", "another gateway's worker")

	require.Error(t, get(t, other.DialConfig("pool-a"), worker), "another gateway's client certificate")
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // a client that trusts anything still gets nothing
	require.Error(t, get(t, noCert, worker), "no client certificate")
	workerPair, err := tls.X509KeyPair(creds.CertPEM, creds.KeyPEM)
	require.NoError(t, err)
	asWorker := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{workerPair}} //nolint:gosec // see above
	require.Error(t, get(t, asWorker, worker), "a worker's certificate opens no worker")

	// plaintext HTTP/1.1 and h2c to the TLS port get no answer
	c, err := net.Dial("tcp", worker)
	require.NoError(t, err)
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	b, _ := io.ReadAll(c)
	require.NotContains(t, string(b), "ok")
	_ = c.Close()
}

// TestRegistryTLS: a worker dials the Registry with its credentials and accepts only the
// gateway's certificate.
func TestRegistryTLS(t *testing.T) {
	a, err := Open(filepath.Join(t.TempDir(), "tls"))
	require.NoError(t, err)
	other, err := Open(filepath.Join(t.TempDir(), "tls"))
	require.NoError(t, err)
	creds, err := a.Issue("p", 0)
	require.NoError(t, err)
	dial, err := creds.RegistryDialConfig()
	require.NoError(t, err)
	require.NoError(t, get(t, dial, serveTLS(t, a.RegistryConfig())))
	require.Error(t, get(t, dial, serveTLS(t, other.RegistryConfig())), "another gateway's registry")
}

// TestOpenKeepsCAs: the CAs persist across Open (workers issued before a restart keep
// working); credentials written and loaded back are the same; keys others may read, and a
// folder others may write, are refused.
func TestOpenKeepsCAs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	a, err := Open(dir)
	require.NoError(t, err)
	creds, err := a.Issue("p", 0)
	require.NoError(t, err)
	b, err := Open(dir)
	require.NoError(t, err)
	require.Equal(t, a.GatewayCAPEM(), b.GatewayCAPEM())
	scfg, err := creds.ServerConfig()
	require.NoError(t, err)
	require.NoError(t, get(t, b.DialConfig("p"), serveTLS(t, scfg)), "a worker issued before the restart")

	files, err := creds.Write(filepath.Join(t.TempDir(), "w"))
	require.NoError(t, err)
	for _, f := range []string{files.Cert, files.Key, files.CA} {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}
	back, err := Load(files)
	require.NoError(t, err)
	require.Equal(t, creds, back)
	require.NoError(t, os.Chmod(files.Key, 0o644))
	_, err = Load(files)
	require.ErrorContains(t, err, "chmod 600")

	require.NoError(t, os.Chmod(filepath.Join(dir, workerKey), 0o640))
	_, err = Open(dir)
	require.ErrorContains(t, err, "chmod 600")
	require.NoError(t, os.Chmod(filepath.Join(dir, workerKey), 0o600))
	require.NoError(t, os.Chmod(dir, 0o777))
	_, err = Open(dir)
	require.ErrorContains(t, err, "chmod 700")

	_, err = a.Issue("../x", 0)
	require.Error(t, err)
	_, err = FromPEM(creds.CertPEM, []byte("not a key"), creds.CAPEM)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "not a key", "key material never shows in an error")
}
