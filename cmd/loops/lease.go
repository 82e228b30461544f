package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/lease/pglease"
)

// leaseFlags configure the leader lease of gateways that share a PostgreSQL database
// (docs/two-gateways.md).
type leaseFlags struct {
	enabled   bool
	advertise string
	ttl       time.Duration
}

func (l *leaseFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&l.enabled, "leader-lease", envBool("LOOPS_LEADER_LEASE", true), "PostgreSQL: take part in the leader lease, so that a second loops serve on the same database is a standby that forwards to the leader and takes over when it dies (LOOPS_LEADER_LEASE); false: this gateway assumes it is the only one")
	fl.StringVar(&l.advertise, "advertise-url", env("LOOPS_ADVERTISE_URL", ""), "PostgreSQL with the lease: the http://host:port other gateways reach this one at (default: http:// and --addr, which must then not be a wildcard address)")
	fl.DurationVar(&l.ttl, "lease-ttl", envDuration("LOOPS_LEASE_TTL", lease.DefaultTTL), "PostgreSQL with the lease: how long the lease lasts after the leader's last renewal; a standby takes over at most this long after the leader dies, plus about a second (LOOPS_LEASE_TTL)")
}

// open returns the lease configuration for a gateway listening at addr on the PostgreSQL
// database dbURL, and the function that closes the lease's connections; nil without a lease
// (SQLite, or --leader-lease=false).
func (l *leaseFlags) open(ctx context.Context, dbURL string, addr net.Addr, connectTimeout time.Duration, log *slog.Logger) (*gateway.LeaseConfig, func(), error) {
	if dbURL == "" || !l.enabled {
		return nil, func() {}, nil
	}
	if l.ttl < time.Second || l.ttl > 10*time.Minute {
		return nil, nil, fmt.Errorf("--lease-ttl %s: use 1s to 10m", l.ttl)
	}
	adv := l.advertise
	if adv == "" {
		host, port, _ := net.SplitHostPort(addr.String())
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return nil, nil, fmt.Errorf("--addr %s listens on every interface: set --advertise-url to the http://host:port the other gateways reach this one at", addr)
		}
		adv = "http://" + net.JoinHostPort(host, port)
	}
	if !strings.HasPrefix(adv, "http://") && !strings.HasPrefix(adv, "https://") {
		return nil, nil, fmt.Errorf("--advertise-url %q: use http://host:port", adv)
	}
	st, err := pglease.Open(ctx, dbURL, connectTimeout)
	if err != nil {
		return nil, nil, err
	}
	return &gateway.LeaseConfig{
		Store: st, Address: adv, TTL: l.ttl,
		OnLost: func(err error) {
			// Fencing: the lease could not be renewed in time (or was taken), so another
			// gateway may lead soon. Stop every piece of work at once, as a crash would;
			// what was acknowledged is in the database already.
			log.Error("lost the leader lease: exiting at once so that no work continues", slog.Any("err", err))
			os.Exit(3)
		},
	}, st.Close, nil
}

func envBool(name string, def bool) bool {
	switch strings.ToLower(os.Getenv(name)) {
	case "1", "true", "yes", "on":
		return true
	case "0", "false", "no", "off":
		return false
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
