package jobs

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
)

// DefaultMaxJobConns bounds the connections one job has open to the gateway at once.
const DefaultMaxJobConns = 64

// Listener is the gateway's side of the jobs' relay sockets: it hands the connections the
// jobs open to the gateway's HTTP server, which serves it next to its TCP listener
// (http.Server.Serve(l)), so a job's request costs the gateway one descriptor and goes
// through the same handler, limits and timeouts as any other (the server's
// ReadHeaderTimeout and IdleTimeout close a job's idle connections).
//
// Each connection's RemoteAddr is its job's id, not a loopback address: a job's request
// is never taken for a request from this host (in open mode a loopback peer is an
// operator; gateway/auth).
type Listener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewListener returns a Listener whose Addr is addr (the gateway's TCP address).
func NewListener(addr net.Addr) *Listener {
	return &Listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept returns the next connection a job opened.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept; the jobs' connections not yet accepted are closed.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the gateway's address.
func (l *Listener) Addr() net.Addr { return l.addr }

// listenUnix listens on the Unix socket name in dir, however long dir's path (a socket's
// path is at most 107 bytes): it binds through /proc/self/fd/N/name, N being dir open.
func listenUnix(dir, name string) (net.Listener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name))
	if err != nil {
		return nil, err
	}
	// The path names d, which closes now: the socket goes with its folder.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// serveJob accepts a job's connections on its relay socket and hands them to l, at most
// max open at once: past that the next connection waits in the socket's backlog (no
// descriptor of the gateway's) until one closes. It returns when ctx ends or ln closes.
func (l *Listener) serveJob(ctx context.Context, ln net.Listener, job string, max int) {
	slots := make(chan struct{}, max)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		c, err := ln.Accept()
		if err != nil {
			return
		}
		jc := &jobConn{Conn: c, job: jobAddr(job), release: func() { <-slots }}
		select {
		case l.conns <- jc:
		case <-l.done:
			_ = jc.Close()
		case <-ctx.Done():
			_ = jc.Close()
			return
		}
	}
}

// jobConn is a job's connection: its RemoteAddr names the job; Close frees its slot.
type jobConn struct {
	net.Conn
	job     jobAddr
	once    sync.Once
	release func()
}

func (c *jobConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

func (c *jobConn) RemoteAddr() net.Addr { return c.job }

// jobAddr is a job's connection's remote address: the job's id.
type jobAddr string

func (a jobAddr) Network() string { return "job" }
func (a jobAddr) String() string  { return string(a) }
