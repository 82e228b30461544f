package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/backends/pools/mtls"
)

// poolCredentialsCmd is `loops pools credentials`: the TLS credentials of a worker started
// by hand (a static pool's worker, one on another host), issued from the gateway's worker
// CA in its data dir. It runs on the gateway's host, as the gateway's user; nothing goes
// over the network.
func poolCredentialsCmd() *cobra.Command {
	var dataDir, tlsDir, out string
	var validFor time.Duration
	cmd := &cobra.Command{
		Use:   "credentials POOL --out DIR",
		Short: "Issue the TLS credentials of a worker started by hand (run on the gateway's host)",
		Long: `credentials issues a worker of pool POOL its TLS credentials from the gateway's worker CA
(--data-dir/pools/tls, or the torch backend's tls_dir option): DIR/cert.pem, DIR/key.pem and
DIR/ca.pem (the gateway CA), mode 0600 in a folder of mode 0700. Copy DIR to the worker's host
by a private channel and start the worker with them:

  loops worker --listen 0.0.0.0:7460 --tls-cert DIR/cert.pem --tls-key DIR/key.pem --tls-ca DIR/ca.pem ...
  python -m loops_worker --listen 0.0.0.0:7460 --tls-cert DIR/cert.pem --tls-key DIR/key.pem --tls-ca DIR/ca.pem ...

The worker then answers only this gateway, and this gateway talks to it only as a worker of
POOL (a static pool's id is torch- and its model's name, e.g. torch-Qwen-Qwen3-8B: loops pools
list shows it). Anyone holding key.pem can pose as a worker of POOL: keep it private, and
issue credentials again (a new key) to replace a worker's. Removing the worker CA (its
folder) and restarting the gateway revokes every worker certificate at once. See
docs/pools.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := pools.ValidateID(args[0]); err != nil {
				return err
			}
			if out == "" {
				return errors.New("--out DIR is required: the folder to write cert.pem, key.pem and ca.pem into")
			}
			if validFor <= 0 || validFor > 10*365*24*time.Hour {
				return fmt.Errorf("--valid-for %v: want a duration between 1s and 87600h (10 years)", validFor)
			}
			dir := tlsDir
			if dir == "" {
				dir = filepath.Join(dataDir, "pools", "tls")
			}
			a, err := mtls.Open(dir)
			if err != nil {
				return err
			}
			c, err := a.Issue(args[0], validFor)
			if err != nil {
				return err
			}
			files, err := c.Write(out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "credentials of a worker of pool %s, valid for %v, in %s (key.pem is secret)\nstart the worker with: %s\n",
				args[0], validFor, out, strings.Join(files.Args(), " "))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&dataDir, "data-dir", env("LOOPS_DATA_DIR", defaultDataDir()), "the gateway's --data-dir (its worker CA is in pools/tls there)")
	fl.StringVar(&tlsDir, "tls-dir", env("LOOPS_WORKER_TLS_DIR", ""), "the worker CA's folder, when the gateway's torch backend has tls_dir set")
	fl.StringVar(&out, "out", "", "folder to write the credentials into (created with mode 0700)")
	fl.DurationVar(&validFor, "valid-for", mtls.DefaultValidity, "how long the certificate is valid")
	return cmd
}
