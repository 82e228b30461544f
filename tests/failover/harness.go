package failover

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
)

// Options configure a Cluster.
type Options struct {
	// Dir holds everything (data dirs, checkpoints, logs, HAProxy's config).
	Dir string
	// Bin is the loops binary.
	Bin string
	// LeaseTTL is --lease-ttl of both gateways.
	LeaseTTL time.Duration
	// APIKey is the one key both gateways accept.
	APIKey string
}

// Gateway is one `loops serve` process.
type Gateway struct {
	Name    string
	URL     string
	addr    string
	dataDir string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Cluster is the database, two gateways and the front.
type Cluster struct {
	opts     Options
	pg       *pgtest.Server
	DBURL    string
	ckDir    string
	Gateways [2]*Gateway
	// FrontURL is HAProxy's address, which reaches both gateways.
	FrontURL string
	front    *exec.Cmd
}

// Start starts the database, both gateways (the first one leads) and the front.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		return nil, fmt.Errorf("haproxy not found (Debian: apt-get install haproxy): %w", err)
	}
	c := &Cluster{opts: o, ckDir: filepath.Join(o.Dir, "checkpoints")}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.pg, err = pgtest.Launch(nil); err != nil {
		return nil, err
	}
	if c.DBURL, err = c.pg.CreateDatabase(ctx); err != nil {
		return nil, err
	}
	key := make([]byte, 32) // gateways that share a database share the page token key
	_, _ = rand.Read(key)
	for i := range c.Gateways {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		g := &Gateway{Name: fmt.Sprintf("g%d", i+1), addr: "127.0.0.1:" + strconv.Itoa(port),
			dataDir: filepath.Join(o.Dir, fmt.Sprintf("data%d", i+1))}
		g.URL = "http://" + g.addr
		if err := os.MkdirAll(g.dataDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(g.dataDir, "page-token.key"), key, 0o600); err != nil {
			return nil, err
		}
		c.Gateways[i] = g
	}
	if err := c.StartGateway(0); err != nil {
		return nil, err
	}
	if err := c.WaitRole(ctx, 0, "leader", time.Minute); err != nil {
		return nil, err
	}
	if err := c.StartGateway(1); err != nil {
		return nil, err
	}
	if err := c.WaitRole(ctx, 1, "standby", time.Minute); err != nil {
		return nil, err
	}
	if err := c.startFront(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// StartGateway (re)starts gateway i; it leads if nobody else does.
func (c *Cluster) StartGateway(i int) error {
	g := c.Gateways[i]
	g.logPath = filepath.Join(c.opts.Dir, g.Name+".log")
	logf, err := os.OpenFile(g.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.opts.Bin, "serve", "--addr", g.addr, "--data-dir", g.dataDir,
		"--database", c.DBURL, "--checkpoint-store", c.ckDir,
		"--lease-ttl", c.opts.LeaseTTL.String(), "--api-key", c.opts.APIKey,
		"--log-format", "json")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(done)
	}()
	g.mu.Lock()
	g.cmd, g.done = cmd, done
	g.mu.Unlock()
	return nil
}

// Kill sends SIGKILL to gateway i and waits for it to die; it returns when it was sent.
func (c *Cluster) Kill(i int) time.Time {
	g := c.Gateways[i]
	g.mu.Lock()
	cmd, done := g.cmd, g.done
	g.mu.Unlock()
	at := time.Now()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	return at
}

// Health is a gateway's /healthz answer.
type Health struct {
	Status string `json:"status"`
	Role   string `json:"role"`
	Lease  struct {
		Holder    string `json:"holder"`
		Leader    string `json:"leader"`
		Term      int64  `json:"term"`
		Takeovers int    `json:"takeovers"`
	} `json:"lease"`
}

// Health asks gateway i.
func (c *Cluster) Health(ctx context.Context, i int) (Health, error) {
	var h Health
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Gateways[i].URL+"/healthz", nil)
	if err != nil {
		return h, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	return h, json.NewDecoder(resp.Body).Decode(&h)
}

// WaitRole waits until gateway i reports role.
func (c *Cluster) WaitRole(ctx context.Context, i int, role string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if h, err := c.Health(ctx, i); err == nil && h.Role == role {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	tail, _ := os.ReadFile(c.Gateways[i].logPath)
	if len(tail) > 4096 {
		tail = tail[len(tail)-4096:]
	}
	return fmt.Errorf("gateway %s is not %s after %s; the end of its log:\n%s", c.Gateways[i].Name, role, within, tail)
}

// Leader returns the index of the gateway that reports itself leader, or -1.
func (c *Cluster) Leader(ctx context.Context) int {
	for i := range c.Gateways {
		if h, err := c.Health(ctx, i); err == nil && h.Role == "leader" {
			return i
		}
	}
	return -1
}

// Takeover is what a new leader logged when it took over.
type Takeover struct {
	// LapseToLease is from the old lease's expiry to the new lease (database clock);
	// LapseToReady adds the new leader's core start.
	LapseToLease, LapseToReady, CoreStart time.Duration
	Term                                  int64
}

// Takeovers reads the takeovers that gateway i logged, oldest first.
func (c *Cluster) Takeovers(i int) ([]Takeover, error) {
	f, err := os.Open(c.Gateways[i].logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Takeover
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), "leading: this gateway") {
			continue
		}
		var rec struct {
			Term         int64 `json:"term"`
			LapseToLease int64 `json:"lapse_to_lease"`
			LapseToReady int64 `json:"lapse_to_ready"`
			CoreStart    int64 `json:"core_start"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.LapseToReady == 0 {
			continue
		}
		out = append(out, Takeover{Term: rec.Term, LapseToLease: time.Duration(rec.LapseToLease),
			LapseToReady: time.Duration(rec.LapseToReady), CoreStart: time.Duration(rec.CoreStart)})
	}
	return out, sc.Err()
}

// LogPath is where gateway i logs.
func (c *Cluster) LogPath(i int) string { return c.Gateways[i].logPath }

func (c *Cluster) startFront(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	c.FrontURL = "http://127.0.0.1:" + strconv.Itoa(port)
	cfg := fmt.Sprintf(`global
	maxconn 2000
defaults
	mode http
	timeout connect 1s
	timeout client 5m
	timeout server 5m
	timeout http-request 1m
	retries 3
	option redispatch 1
	retry-on conn-failure empty-response
frontend front
	bind 127.0.0.1:%d
	default_backend gateways
backend gateways
	balance roundrobin
	option httpchk GET /healthz
	default-server inter 300ms fall 2 rise 1
	server g1 %s check
	server g2 %s check
`, port, c.Gateways[0].addr, c.Gateways[1].addr)
	path := filepath.Join(c.opts.Dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(c.opts.Dir, "haproxy.log"))
	if err != nil {
		return err
	}
	c.front = exec.Command("haproxy", "-db", "-f", path)
	c.front.Stdout, c.front.Stderr = logf, logf
	if err := c.front.Start(); err != nil {
		return err
	}
	go func() { _ = c.front.Wait(); _ = logf.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(c.FrontURL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("haproxy did not answer within 30 s (see haproxy.log)")
}

// Close stops the front, the gateways and the database.
func (c *Cluster) Close() {
	if c.front != nil && c.front.Process != nil {
		_ = c.front.Process.Signal(syscall.SIGTERM)
	}
	for i, g := range c.Gateways {
		if g != nil {
			g.mu.Lock()
			cmd := g.cmd
			g.mu.Unlock()
			if cmd != nil && cmd.Process != nil {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-g.done:
				case <-time.After(20 * time.Second):
					c.Kill(i)
				}
			}
		}
	}
	if c.pg != nil {
		c.pg.Stop()
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
