package mtls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Names in the certificates.
const (
	// GatewayURI is the URI SAN of the gateway's certificate; GatewayCommonName its common
	// name (the Python worker checks it, as grpc shows no URI SANs).
	GatewayURI        = "loops://gateway"
	GatewayCommonName = "loops-gateway"
	// RegistryServerName is the DNS SAN of the gateway's certificate that workers check
	// when they dial the Registry, whatever host its URL names.
	RegistryServerName = "loops-registry"
	// poolURIPrefix starts the URI SAN of a worker's certificate; the pool id follows.
	poolURIPrefix = "loops://pool/"
)

// The environment variables that carry a worker's credentials as PEM text, where no file
// can be written for it (the Ray provider's pool driver and its actors).
const (
	EnvCert = "LOOPS_WORKER_TLS_CERT"
	EnvKey  = "LOOPS_WORKER_TLS_KEY"
	EnvCA   = "LOOPS_WORKER_TLS_CA"
)

// Validity of the certificates.
const (
	caValidity      = 10 * 365 * 24 * time.Hour
	gatewayValidity = 365 * 24 * time.Hour
	// DefaultValidity is how long a worker certificate is valid unless asked otherwise.
	DefaultValidity = 365 * 24 * time.Hour
	// backdate covers clocks a little behind the gateway's.
	backdate = time.Hour
)

// Files in an Authority's folder.
const (
	gatewayCAFile = "gateway-ca.pem"
	gatewayKey    = "gateway-ca.key"
	workerCAFile  = "worker-ca.pem"
	workerKey     = "worker-ca.key"
	lockFile      = ".lock"
)

var poolIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// issuer is one CA: its certificate and key.
type issuer struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// Authority is the gateway's side: its two CAs and its own certificate. Safe for
// concurrent use.
type Authority struct {
	dir         string
	gatewayCA   issuer
	workerCA    issuer
	workerRoots *x509.CertPool
	gateway     tls.Certificate // this process's identity, issued by Open
}

// Open loads the CAs kept in dir, creating the folder (mode 0700) and the CAs the first
// time, and issues the gateway's certificate for this process. A key file that others may
// read, or a folder that others may write, is refused: a copy of a CA key opens every
// worker.
func Open(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("worker TLS: creating %s: %w", dir, err)
	}
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("worker TLS: %w", err)
	}
	defer func() { _ = lock.Close() }() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("worker TLS: locking %s: %w", lock.Name(), err)
	}
	a := &Authority{dir: dir}
	if a.gatewayCA, err = loadOrCreateCA(dir, gatewayCAFile, gatewayKey, "Loops gateway CA"); err != nil {
		return nil, err
	}
	if a.workerCA, err = loadOrCreateCA(dir, workerCAFile, workerKey, "Loops worker CA"); err != nil {
		return nil, err
	}
	a.workerRoots = x509.NewCertPool()
	a.workerRoots.AddCert(a.workerCA.cert)
	certPEM, keyPEM, err := a.gatewayCA.issue(leafTemplate(GatewayCommonName, GatewayURI, gatewayValidity,
		x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth), RegistryServerName)
	if err != nil {
		return nil, err
	}
	if a.gateway, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("worker TLS: the gateway's certificate: %w", err)
	}
	return a, nil
}

// Dir is the Authority's folder.
func (a *Authority) Dir() string { return a.dir }

// GatewayCAPEM is the gateway CA's certificate: what a worker trusts.
func (a *Authority) GatewayCAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.gatewayCA.cert.Raw})
}

// Issue returns new credentials for a worker of pool, valid for validity (DefaultValidity
// when 0 or less): a fresh key, its certificate from the worker CA, and the gateway CA.
func (a *Authority) Issue(pool string, validity time.Duration) (*Credentials, error) {
	if !poolIDRE.MatchString(pool) {
		return nil, fmt.Errorf("worker TLS: pool id %q must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", pool)
	}
	if validity <= 0 {
		validity = DefaultValidity
	}
	certPEM, keyPEM, err := a.workerCA.issue(leafTemplate("loops-worker "+pool, poolURIPrefix+pool, validity, x509.ExtKeyUsageServerAuth))
	if err != nil {
		return nil, err
	}
	return &Credentials{Pool: pool, CertPEM: certPEM, KeyPEM: keyPEM, CAPEM: a.GatewayCAPEM()}, nil
}

// DialConfig is the TLS configuration of the gateway dialling workers of pool: it
// presents the gateway's certificate and accepts only a certificate of the worker CA that
// names pool.
func (a *Authority) DialConfig(pool string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.gateway},
		NextProtos:   []string{"h2"},
		// A worker's certificate names its pool, not a host (workers register whatever
		// address they serve at): VerifyConnection checks the chain and the pool instead
		// of the host name.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return a.verifyWorker(cs.PeerCertificates, pool)
		},
	}
}

// verifyWorker checks a worker's certificate chain against the worker CA, and that it
// names pool.
func (a *Authority) verifyWorker(chain []*x509.Certificate, pool string) error {
	if len(chain) == 0 {
		return errors.New("the worker presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: a.workerRoots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("the worker's certificate was not issued by this gateway: %w", err)
	}
	got := PoolOf(chain[0])
	if got != pool {
		return fmt.Errorf("the worker's certificate is for pool %q, not %q: it is not the worker this gateway dials", got, pool)
	}
	return nil
}

// PoolOf is the pool a worker certificate names ("" if none).
func PoolOf(c *x509.Certificate) string {
	for _, u := range c.URIs {
		if s := u.String(); strings.HasPrefix(s, poolURIPrefix) {
			return strings.TrimPrefix(s, poolURIPrefix)
		}
	}
	return ""
}

// RegistryConfig is the TLS configuration of the Registry's listener (the gateway's
// certificate; workers authenticate with the join token).
func (a *Authority) RegistryConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{a.gateway}}
}

// Credentials are what a worker needs: its certificate and key (PEM), and the gateway
// CA's certificate, which it checks its clients and the Registry against.
type Credentials struct {
	// Pool is the pool the certificate names.
	Pool                   string
	CertPEM, KeyPEM, CAPEM []byte
}

// Files names the files of a worker's credentials.
type Files struct {
	Cert, Key, CA string
}

// Args are the worker command-line flags that name the files (paths only: never a
// secret on a command line).
func (f Files) Args() []string {
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
}

// Write writes the credentials into dir (created with mode 0700; files of mode 0600,
// replaced atomically) as cert.pem, key.pem and ca.pem.
func (c *Credentials) Write(dir string) (Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("worker TLS: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("worker TLS: %w", err)
	}
	f := Files{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"), CA: filepath.Join(dir, "ca.pem")}
	for _, w := range []struct {
		path string
		data []byte
	}{{f.Key, c.KeyPEM}, {f.Cert, c.CertPEM}, {f.CA, c.CAPEM}} {
		if err := writePrivate(w.path, w.data); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// Env returns the credentials as environment variables (EnvCert, EnvKey, EnvCA).
func (c *Credentials) Env() map[string]string {
	return map[string]string{EnvCert: string(c.CertPEM), EnvKey: string(c.KeyPEM), EnvCA: string(c.CAPEM)}
}

// Load reads credentials from files. The key file must not be readable by others.
func Load(f Files) (*Credentials, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, errors.New("worker TLS: the certificate, key and CA files are all required")
	}
	if err := privateFile(f.Key); err != nil {
		return nil, err
	}
	var c Credentials
	for _, r := range []struct {
		path string
		dst  *[]byte
	}{{f.Cert, &c.CertPEM}, {f.Key, &c.KeyPEM}, {f.CA, &c.CAPEM}} {
		b, err := os.ReadFile(r.path)
		if err != nil {
			return nil, fmt.Errorf("worker TLS: %w", err)
		}
		*r.dst = b
	}
	return c.checked()
}

// FromPEM makes credentials of PEM text (EnvCert, EnvKey, EnvCA).
func FromPEM(cert, key, ca []byte) (*Credentials, error) {
	c := Credentials{CertPEM: cert, KeyPEM: key, CAPEM: ca}
	return c.checked()
}

// checked parses the credentials: the pair must match, name a pool, and the CA must be a
// certificate.
func (c Credentials) checked() (*Credentials, error) {
	pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, errors.New("worker TLS: the certificate and key do not make a pair (issue them with loops pools credentials)")
	}
	if c.Pool = PoolOf(pair.Leaf); c.Pool == "" {
		return nil, errors.New("worker TLS: the certificate names no pool: it was not issued by a Loops gateway for a worker")
	}
	if !x509.NewCertPool().AppendCertsFromPEM(c.CAPEM) {
		return nil, errors.New("worker TLS: the CA file holds no certificate (it is the gateway's ca.pem)")
	}
	return &c, nil
}

// ServerConfig is the TLS configuration of a worker serving: it presents its certificate
// and accepts only clients with a certificate of the gateway CA that names the gateway.
func (c *Credentials) ServerConfig() (*tls.Config, error) {
	pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, errors.New("worker TLS: the certificate and key do not make a pair")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.CAPEM) {
		return nil, errors.New("worker TLS: the CA file holds no certificate")
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		NextProtos:   []string{"h2"},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !names(cs.PeerCertificates[0], GatewayURI) {
				return errors.New("the client's certificate is not the gateway's")
			}
			return nil
		},
	}, nil
}

// RegistryDialConfig is the TLS configuration of a worker dialling the gateway's
// Registry: it accepts only the gateway's certificate.
func (c *Credentials) RegistryDialConfig() (*tls.Config, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.CAPEM) {
		return nil, errors.New("worker TLS: the CA file holds no certificate")
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: RegistryServerName, NextProtos: []string{"h2"}}, nil
}

func names(c *x509.Certificate, uri string) bool {
	for _, u := range c.URIs {
		if u.String() == uri {
			return true
		}
	}
	return false
}

// HTTPClient is an HTTP/2 client over TLS with cfg (gRPC to workers and to the Registry).
func HTTPClient(cfg *tls.Config) *http.Client {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p, TLSClientConfig: cfg, TLSHandshakeTimeout: 10 * time.Second,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext}}
}

// ---- certificates --------------------------------------------------------------------------

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func leafTemplate(cn, uri string, validity time.Duration, usage ...x509.ExtKeyUsage) *x509.Certificate {
	u, _ := url.Parse(uri) // a constant prefix and a checked pool id
	now := time.Now()
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, URIs: []*url.URL{u},
		NotBefore: now.Add(-backdate), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, BasicConstraintsValid: true}
}

// issue signs a fresh key's certificate of template (with dnsNames) and returns both PEM.
func (is issuer) issue(tmpl *x509.Certificate, dnsNames ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("worker TLS: %w", err)
	}
	if tmpl.SerialNumber, err = serial(); err != nil {
		return nil, nil, fmt.Errorf("worker TLS: %w", err)
	}
	tmpl.DNSNames = dnsNames
	if tmpl.NotAfter.After(is.cert.NotAfter) {
		tmpl.NotAfter = is.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, &key.PublicKey, is.key)
	if err != nil {
		return nil, nil, fmt.Errorf("worker TLS: signing a certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("worker TLS: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// loadOrCreateCA loads the CA of certFile and keyFile in dir, or creates it when neither
// exists.
func loadOrCreateCA(dir, certFile, keyFile, cn string) (issuer, error) {
	cp, kp := filepath.Join(dir, certFile), filepath.Join(dir, keyFile)
	_, cerr := os.Stat(cp)
	_, kerr := os.Stat(kp)
	if errors.Is(cerr, os.ErrNotExist) && errors.Is(kerr, os.ErrNotExist) {
		return createCA(cp, kp, cn)
	}
	if err := privateFile(kp); err != nil {
		return issuer{}, err
	}
	craw, err := os.ReadFile(cp)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	kraw, err := os.ReadFile(kp)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	pair, err := tls.X509KeyPair(craw, kraw)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %s and %s do not make a pair; remove both to make a new CA (then issue the credentials of hand-started workers again)", cp, kp)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !pair.Leaf.IsCA {
		return issuer{}, fmt.Errorf("worker TLS: %s is not a CA", cp)
	}
	return issuer{cert: pair.Leaf, key: key}, nil
}

func createCA(certPath, keyPath, cn string) (issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	ski := sha256.Sum256(spki)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-backdate), NotAfter: now.Add(caValidity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		SubjectKeyId: ski[:20]}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	if err := writePrivate(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})); err != nil {
		return issuer{}, err
	}
	if err := writePrivate(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return issuer{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return issuer{}, fmt.Errorf("worker TLS: %w", err)
	}
	return issuer{cert: cert, key: key}, nil
}

// writePrivate writes data to path (mode 0600) through a temporary file and a rename, so
// a reader never sees half a file.
func writePrivate(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("worker TLS: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("worker TLS: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("worker TLS: writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("worker TLS: writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("worker TLS: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("worker TLS: %w", err)
	}
	return nil
}

// privateFile refuses a key file that others may read or write.
func privateFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("worker TLS: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("worker TLS: key file %s may be read by other users (mode %04o); chmod 600 it", path, fi.Mode().Perm())
	}
	return nil
}

// privateDir refuses a folder of keys that others may write (they could replace a CA).
func privateDir(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("worker TLS: %w", err)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("worker TLS: folder %s may be written by other users (mode %04o); chmod 700 it", path, fi.Mode().Perm())
	}
	return nil
}
