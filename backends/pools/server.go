package pools

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"
)

// Server serves a Registry on its own listener, over TLS only (HTTP/2 and HTTP/1.1:
// heartbeats are gRPC bidirectional streams).
type Server struct {
	srv *http.Server
	l   net.Listener
}

// Serve starts serving r on addr (host:port; port 0 picks one) with cfg, the Registry's
// TLS configuration (mtls.Authority.RegistryConfig): workers send the join token, which
// never crosses a network in the clear.
func Serve(r *Registry, addr string, cfg *tls.Config) (*Server, error) {
	if cfg == nil || len(cfg.Certificates) == 0 && cfg.GetCertificate == nil {
		return nil, errors.New("the worker registry serves over TLS only: a certificate is required")
	}
	cfg = cfg.Clone()
	if len(cfg.NextProtos) == 0 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(r.Handler())
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	s := &Server{l: l, srv: &http.Server{Handler: mux, Protocols: p, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}}
	go func() {
		if err := s.srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("registry server stopped", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.l.Addr().String() }

// URL is the base URL workers register at (https://host:port).
func (s *Server) URL() string { return "https://" + s.Addr() }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}
