// Package pgtest starts throwaway PostgreSQL servers for tests.
//
// Start creates a fresh cluster with initdb in a temporary folder, starts postgres on a free
// loopback port (its Unix socket in the same folder, fsync off), waits until it accepts
// connections, and stops it and removes the folder when the test ends, or, in a package
// whose TestMain calls Main, when all its tests are done (one cluster per test binary).
// NewDatabase and the much cheaper NewSchema give each test an empty database of its own.
// Run as root, the cluster belongs to an unprivileged user (postgres when that user exists,
// else nobody), because initdb and postgres refuse to run as root.
//
// The binaries are looked up in $LOOPS_PG_BIN, then on PATH, then in the newest
// /usr/lib/postgresql/*/bin (Debian's postgresql package) and /usr/local/pgsql/bin. Without
// them Start skips the test with a message saying how to install them, except under CI
// (CI=true), where it fails it: CI must never pass by skipping the PostgreSQL tests.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// startTimeout bounds initdb plus the wait for the server to accept connections.
const startTimeout = 2 * time.Minute

// Server is a running throwaway PostgreSQL cluster.
type Server struct {
	// URL is the postgres:// URL of the cluster's "postgres" database, as the superuser.
	URL string

	host string
	port int
	dbs  atomic.Int64
	stop func()
}

// ErrNoBinaries is returned by Launch when initdb and postgres cannot be found.
var ErrNoBinaries = errors.New("PostgreSQL binaries (initdb, postgres) not found")

// shared is the one cluster of a test binary whose TestMain calls Main.
var shared struct {
	sync.Mutex
	inMain bool
	s      *Server
	err    error
}

// Main runs the tests of a package whose tests share one cluster, started by the first
// Start and stopped when they are all done: TestMain(m) { os.Exit(pgtest.Main(m)) }.
func Main(m *testing.M) int {
	shared.Lock()
	shared.inMain = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.s != nil {
		shared.s.Stop()
	}
	return code
}

// Start returns a throwaway cluster: in a package whose TestMain calls Main, the one the
// package's tests share (give each test its own NewSchema or NewDatabase); otherwise a
// cluster of its own, stopped and removed when tb ends. It skips tb when the PostgreSQL
// binaries are missing, unless CI=true, where it fails it.
func Start(tb testing.TB) *Server {
	tb.Helper()
	var s *Server
	var err error
	shared.Lock()
	if shared.inMain {
		if shared.s == nil && shared.err == nil {
			shared.s, shared.err = Launch(nil)
		}
		s, err = shared.s, shared.err
	} else {
		s, err = Launch(nil)
		if err == nil {
			tb.Cleanup(s.Stop)
		}
	}
	shared.Unlock()
	if errors.Is(err, ErrNoBinaries) {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("pgtest: %v (CI=true: the PostgreSQL tests must run; .ci/run installs Debian's postgresql package)", err)
		}
		tb.Skipf("pgtest: %v: install PostgreSQL (Debian: apt-get install postgresql) or set LOOPS_PG_BIN to its bin folder", err)
	}
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return s
}

// Launch starts a throwaway cluster outside a test (for benchmarks); the caller must Stop
// it. settings are name=value server settings applied after pgtest's own (fsync=off,
// synchronous_commit=off, …), for example "fsync=on". Start is the form for tests.
func Launch(settings []string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // another process may take the free port before postgres binds it
		s, err := start(bin, settings)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// Stop stops the server and removes its folder.
func (s *Server) Stop() { s.stop() }

// NewDatabase creates an empty database in the cluster and returns its URL.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	url, err := s.CreateDatabase(context.Background())
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return url
}

// CreateDatabase creates an empty database in the cluster and returns its URL.
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("test_%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.dbURL(name), nil
}

// NewSchema creates an empty schema in the cluster's postgres database and returns a URL
// whose search_path is that schema alone: to a store, which names its tables without a
// schema, an empty database, made in milliseconds instead of a CREATE DATABASE's third of a
// second. Advisory locks and server settings are shared with the other schemas.
func (s *Server) NewSchema(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("test_schema_%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create schema %s: %v", name, err)
	}
	return s.dbURL("postgres") + "&search_path=" + name
}

func (s *Server) dbURL(name string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort(s.host, strconv.Itoa(s.port)),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// binDir finds the folder that holds initdb and postgres.
func binDir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("LOOPS_PG_BIN"); d != "" {
		if !has(d) {
			return "", fmt.Errorf("%w: LOOPS_PG_BIN=%s has none", ErrNoBinaries, d)
		}
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	slices.SortFunc(debian, func(a, b string) int { return version(b) - version(a) })
	for _, d := range append(debian, "/usr/local/pgsql/bin") {
		if has(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

// version is the major version in a /usr/lib/postgresql/N/bin path, 0 when there is none.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// start runs initdb and postgres once.
func start(bin string, settings []string) (s *Server, err error) {
	// Not t.TempDir(): its parents are private to the test's user, and the cluster may
	// belong to another; the folder is short too, which a Unix socket path needs.
	dir, err := os.MkdirTemp("", "loops-pgtest-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data,
		"-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}

	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logf.Close() }()
	args := []string{"-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-k", dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "log_min_messages=warning"}
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	pg := exec.Command(filepath.Join(bin, "postgres"), args...)
	pg.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	pg.Env = append(os.Environ(), "LC_ALL=C")
	pg.Stdout, pg.Stderr = logf, logf
	if err := pg.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = pg.Wait(); close(exited) }()
	stop := func() {
		_ = pg.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = pg.Process.Kill()
			<-exited
		}
	}

	s = &Server{host: "127.0.0.1", port: port, stop: func() { stop(); _ = os.RemoveAll(dir) }}
	s.URL = s.dbURL("postgres")
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.URL)
		ccancel()
		if err == nil {
			_ = conn.Close(context.Background())
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return nil, fmt.Errorf("postgres exited before accepting connections: %s", log)
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("postgres did not accept connections within %s: %w", startTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return s, nil
}

// credential returns the unprivileged user to run PostgreSQL as when this process is root,
// nil otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: false, Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root and neither user postgres nor nobody exists to run PostgreSQL as")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
