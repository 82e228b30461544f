package pools

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Server serves a Registry on its own listener (HTTP/1.1 and h2c: heartbeats are gRPC
// bidirectional streams).
type Server struct {
	srv *http.Server
	l   net.Listener
}

// Serve starts serving r on addr (host:port; port 0 picks one).
func Serve(r *Registry, addr string) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(r.Handler())
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s := &Server{l: l, srv: &http.Server{Handler: mux, Protocols: p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}}
	go func() {
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("registry server stopped", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.l.Addr().String() }

// URL is the base URL workers register at (http://host:port).
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}
