package jobs

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// RelayMain is the program that runs first inside a job's sandbox, as `loops jobs relay
// LISTEN SOCKET -- COMMAND...`. The sandbox has its own network namespace with nothing but
// loopback, so the job cannot reach any host; the relay listens on LISTEN (127.0.0.1 and the
// gateway's port) and carries each connection to SOCKET, a Unix socket the gateway bound
// into the sandbox for this job, which leads to the gateway and nothing else. It runs
// COMMAND, passes SIGTERM and SIGINT on to it, and exits with its status (128+signal when a
// signal ended it). It returns the exit status.
func RelayMain(args []string, stderr io.Writer) int {
	if len(args) < 4 || args[2] != "--" {
		fmt.Fprintln(stderr, "usage: relay LISTEN SOCKET -- COMMAND [ARG...]")
		return 2
	}
	listen, socket, argv := args[0], args[1], args[3:]
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintf(stderr, "loops relay: %v\n", err)
		return 125
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go splice(c, func() (net.Conn, error) { return net.Dial("unix", socket) })
		}
	}()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "loops relay: starting %s: %v\n", argv[0], err)
		return 127
	}
	go func() {
		for s := range sig {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(stderr, "loops relay: %v\n", err)
		return 125
	}
	return 0
}

// splice dials the other side and copies both ways until either side closes.
func splice(c net.Conn, dial func() (net.Conn, error)) {
	defer c.Close()
	o, err := dial()
	if err != nil {
		return
	}
	defer o.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(o, c)
	go cp(c, o)
	<-done
	<-done
}
