// Package mtls authenticates the worker protocol (loops.backend.v1) both ways with mutual
// TLS: certificates the gateway issues.
//
// The gateway keeps two certificate authorities in a folder of its data dir (Open): the
// gateway CA, which signs only the gateway's own certificate (its client certificate
// towards the workers, and the server certificate of its worker Registry), and the worker
// CA, which signs the workers' certificates, one per pool (Issue). A worker accepts a
// client only with a certificate of the gateway CA that names the gateway (a worker's own
// certificate, of another CA, never opens another worker); the gateway talks to a worker
// only when the worker's certificate comes from the worker CA and names the pool the
// gateway dials (a worker of pool A never receives the adapters of pool B). TLS 1.3 only.
//
// A worker's certificate names its pool in a URI SAN (loops://pool/ID), not a host: the
// gateway dials workers at whatever address they registered or were configured with, and
// checks the chain and the pool itself (Authority.DialConfig). The Registry's certificate
// names the host RegistryServerName, which workers check instead of the URL's host.
//
// How a worker gets its credentials (Credentials: its certificate and key, and the
// gateway CA's certificate): the local provider writes them into a private folder for the
// workers it starts (files of mode 0600, passed by path), the Ray provider passes them to
// its pool driver in the job's environment, and an operator issues them for a worker
// started by hand (loops pools credentials). Nothing secret is ever on a command line.
package mtls
