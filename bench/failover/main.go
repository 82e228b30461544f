// Command failover measures how long a failover takes: two loops serve gateways on one
// throwaway PostgreSQL behind HAProxy (tests/failover's harness); the leader is killed
// with SIGKILL KILLS times per lease TTL, restarted as the standby each time. For each
// kill it reports the time from the kill to the first successful request through the front
// (a training-run list, which only the leader answers: a standby forwards it), and from the
// old lease's lapse to the new leader's lease and to its core being ready (both from the
// new leader's log; the database's clock). See README.md.
//
//	go run ./bench/failover [-kills 10] [-ttls 10s,3s] [-bin path/to/loops]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/loops-dev/loops/tests/failover"
)

const key = "tml-failover-bench-key"

func main() {
	kills := flag.Int("kills", 10, "kills per TTL")
	ttls := flag.String("ttls", "10s,3s", "lease TTLs to measure, comma-separated")
	bin := flag.String("bin", "", "loops binary (default: built from this tree)")
	flag.Parse()
	if err := run(*kills, *ttls, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "failover bench:", err)
		os.Exit(1)
	}
}

func run(kills int, ttlList, bin string) error {
	dir, err := os.MkdirTemp("", "loops-failover-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin == "" {
		bin = filepath.Join(dir, "loops")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/loops").CombinedOutput(); err != nil {
			return fmt.Errorf("building loops: %v\n%s", err, out)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("# failover bench: %d kills per TTL, %d CPUs, load %s", kills, runtime.NumCPU(), load)
	for _, s := range strings.Split(ttlList, ",") {
		ttl, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		if err := bench(dir, bin, ttl, kills); err != nil {
			return err
		}
	}
	return nil
}

func bench(parent, bin string, ttl time.Duration, kills int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp(parent, "ttl-")
	if err != nil {
		return err
	}
	c, err := failover.Start(ctx, failover.Options{Dir: dir, Bin: bin, LeaseTTL: ttl, APIKey: key})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("\n## lease TTL %s\n\n| kill | killed | kill → first OK through the front | lease lapse → new lease | lease lapse → new leader ready | core start |\n|---|---|---|---|---|---|\n", ttl)
	var toOK, toLease, toReady []time.Duration
	for k := 1; k <= kills; k++ {
		leader := c.Leader(ctx)
		if leader < 0 {
			return fmt.Errorf("no leader before kill %d", k)
		}
		other := 1 - leader
		before, err := c.Takeovers(other)
		if err != nil {
			return err
		}
		// Kill at a random point of the renewal cycle.
		time.Sleep(time.Duration(rand.Int64N(int64(ttl / 4))))
		at := c.Kill(leader)
		ok, err := firstOK(ctx, c.FrontURL, at, 2*ttl+30*time.Second)
		if err != nil {
			return err
		}
		var tk failover.Takeover
		for deadline := time.Now().Add(10 * time.Second); ; {
			after, err := c.Takeovers(other)
			if err != nil {
				return err
			}
			if len(after) > len(before) {
				tk = after[len(after)-1]
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kill %d: %s logged no takeover", k, c.Gateways[other].Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
		toOK, toLease, toReady = append(toOK, ok), append(toLease, tk.LapseToLease), append(toReady, tk.LapseToReady)
		fmt.Printf("| %d | %s | %s | %s | %s | %s |\n", k, c.Gateways[leader].Name, ms(ok), ms(tk.LapseToLease), ms(tk.LapseToReady), ms(tk.CoreStart))
		if err := c.StartGateway(leader); err != nil {
			return err
		}
		if err := c.WaitRole(ctx, leader, "standby", time.Minute); err != nil {
			return err
		}
		time.Sleep(time.Second) // HAProxy's checks see it up again
	}
	fmt.Printf("\nkill → first OK: %s; lapse → lease: %s; lapse → ready: %s (min / median / max)\n", summary(toOK), summary(toLease), summary(toReady))
	return nil
}

// firstOK polls the front until a training-run list succeeds and returns the time since at.
func firstOK(ctx context.Context, front string, at time.Time, within time.Duration) (time.Duration, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	for time.Since(at) < within {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, front+"/v1/training_runs?limit=1", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("X-API-Key", key)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(at), nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("no successful request through the front within %s of the kill", within)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%s / %s / %s", ms(s[0]), ms(s[len(s)/2]), ms(s[len(s)-1]))
}
