package serve

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/pools/mtls"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
)

// tlsArgs writes a worker's credentials and returns the flags that name them, and the
// credentials.
func tlsArgs(t testing.TB, dir string) ([]string, *mtls.Credentials) {
	t.Helper()
	a, err := mtls.Open(filepath.Join(dir, "ca"))
	require.NoError(t, err)
	c, err := a.Issue("p", 0)
	require.NoError(t, err)
	files, err := c.Write(filepath.Join(dir, "worker"))
	require.NoError(t, err)
	return files.Args(), c
}

// TestParseArgs: the command line the gateway's local provider gives a worker, and the
// defaults.
func TestParseArgs(t *testing.T) {
	t.Setenv(ExitOnStdinEOFEnv, "1")
	targs, creds := tlsArgs(t, t.TempDir())
	allowed := t.TempDir()
	o, err := ParseArgs(append([]string{"--listen", "127.0.0.1:0", "--register", "https://127.0.0.1:7450", "--pool", "torch-loops-tiny",
		"--replica", "3", "--join-token-file", "/tmp/token", "--model", "loops/tiny=/data/models/loops-tiny",
		"--max-lora-rank", "32", "--device", "cpu", "--threads", "2", "--max-adapters", "8", "--prefix-cache-bytes", "1048576", "--data-dir", "/tmp/d", "--advertise", "10.0.0.5",
		"--allow-dir", allowed, "--checkpoint-origin", "https://s3.example.com"}, targs...))
	require.NoError(t, err)
	require.Equal(t, Options{Listen: "127.0.0.1:0", Register: "https://127.0.0.1:7450", Pool: "torch-loops-tiny", Replica: 3,
		JoinTokenFile: "/tmp/token", Advertise: "10.0.0.5", ExitOnStdinEOF: true, Credentials: creds,
		AllowDirs: []string{allowed}, CheckpointOrigins: []string{"https://s3.example.com"},
		Engine: reference.Options{DataDir: "/tmp/d", Models: []string{tiny.Name}, MaxLoraRank: 32, MaxAdapters: 8, Threads: 2, PrefixCacheBytes: 1 << 20}}, o)

	t.Setenv(ExitOnStdinEOFEnv, "")
	o, err = ParseArgs(targs)
	require.NoError(t, err)
	require.Equal(t, Options{Listen: "127.0.0.1:0", Credentials: creds,
		Engine: reference.Options{DataDir: defaultDataDir(), MaxLoraRank: 64, MaxAdapters: 256}}, o, "the Python worker's defaults; no model: the engine's (loops/tiny)")
	_, err = ParseArgs(nil)
	require.ErrorContains(t, err, "--tls-cert, --tls-key and --tls-ca are required", "no credentials, no worker")

	// a folder named by itself, or by the Hugging Face id that resolves to it
	dir := t.TempDir()
	model := filepath.Join(dir, "m")
	require.NoError(t, tiny.Write(model))
	o, err = ParseArgs(append([]string{"--model", model, "--model", model + "=" + model + "/", "-model=Org/Name"}, targs...))
	require.NoError(t, err)
	require.Equal(t, []string{model, model, "Org/Name"}, o.Engine.Models)
	hub := filepath.Join(dir, "hub")
	t.Setenv("HF_HUB_CACHE", hub)
	snap := filepath.Join(hub, "models--Org--Name", "snapshots", "abc")
	require.NoError(t, os.MkdirAll(filepath.Dir(snap), 0o755))
	require.NoError(t, os.Symlink(model, snap))
	o, err = ParseArgs(append([]string{"--model", "Org/Name=" + snap, "--model", "Org/Name=" + model}, targs...))
	require.NoError(t, err)
	require.Equal(t, []string{"Org/Name", "Org/Name"}, o.Engine.Models)

	_, err = ParseArgs([]string{"--help"})
	require.ErrorIs(t, err, flag.ErrHelp)
}

// TestParseArgsErrors: each bad command line is refused with a reason that says what to
// pass instead.
func TestParseArgsErrors(t *testing.T) {
	targs, _ := tlsArgs(t, t.TempDir())
	model := filepath.Join(t.TempDir(), "m")
	require.NoError(t, tiny.Write(model))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--device", "cuda"}, "the Go worker runs on the CPU"},
		{[]string{"--device", "cuda:0"}, "the Go worker runs on the CPU"},
		{[]string{"--dtype", "bfloat16"}, "--dtype is a flag of the Python worker"},
		{[]string{"--vllm-enforce-eager"}, "flag of the Python worker"},
		{[]string{"--world-size", "2"}, "--world-size spreads a replica over several GPUs, which only the Python worker does"},
		{[]string{"--vllm-tensor-parallel-size", "4"}, "give its pool gpus_per_replica 0 or 1"},
		{[]string{"--gpus", "2"}, "unknown flag --gpus"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--model"}, "flag needs an argument"},
		{[]string{"--model", "=x"}, "the model name is empty"},
		{[]string{"--model", "Org/Name="}, "the path after = is empty"},
		{[]string{"--model", "my-model=" + model}, "cannot serve " + model + ` as "my-model"`},
		{[]string{"--listen", "7460"}, "is not host:port"},
		{[]string{"--listen", "127.0.0.1:99999"}, "port must be a number"},
		{[]string{"--listen", "127.0.0.1:http"}, "port must be a number"},
		{[]string{"--max-lora-rank", "0"}, "--max-lora-rank must be at least 1"},
		{[]string{"--max-adapters", "-1"}, "--max-adapters must be at least 1"},
		{[]string{"--threads", "-2"}, "--threads must be 0"},
		{[]string{"--threads", "many"}, "invalid value"},
		{[]string{"--prefix-cache-bytes", "-1"}, "--prefix-cache-bytes: \"-1\" is not a number of bytes from 0 (off)"},
		{[]string{"--prefix-cache-bytes", "1GiB"}, "is not a number of bytes"},
		{[]string{"--replica", "1024"}, "--replica must be between 0 and 1023"},
		{[]string{"--data-dir", ""}, "--data-dir must not be empty"},
		{[]string{"--register", "https://127.0.0.1:1"}, "--register needs --pool and --join-token-file"},
		{[]string{"--register", "127.0.0.1:7450", "--pool", "p", "--join-token-file", "f"}, "is not a registry URL"},
		{[]string{"--register", "https://h:1", "--pool", "p q", "--join-token-file", "f"}, "--pool \"p q\" must be"},
		{[]string{"--register", "http://h:1", "--pool", "p", "--join-token-file", "f"}, "the registry serves TLS only"},
		{[]string{"--allow-dir", "relative"}, "must be an absolute path"},
		{[]string{"--allow-dir", "/does/not/exist"}, "--allow-dir /does/not/exist"},
		{[]string{"--checkpoint-origin", "https://s3.example.com/bucket"}, "must be scheme://host[:port]"},
		{[]string{"--checkpoint-origin", "ftp://h"}, "must be scheme://host[:port]"},
		{[]string{"--tls-cert", "/nonexistent", "--tls-key", "/nonexistent", "--tls-ca", "/nonexistent"}, "no such file"},
	} {
		_, err := ParseArgs(append(slices.Clone(targs), c.args...))
		require.ErrorContains(t, err, c.want, "%q", c.args)
	}
}

// FuzzParseArgs: any command line parses or is refused with an error; never a panic, and
// what parses holds values Run can take.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{"", "--listen 127.0.0.1:0 --model loops/tiny=/x --max-lora-rank 8",
		"--register https://h:1 --pool p --replica 2 --join-token-file t", "--device gpu", "--model a=b --model =",
		"--allow-dir / --checkpoint-origin https://s3:9000", "--allow-dir ../x", "--checkpoint-origin http://u@h",
		"-threads=-1", "--listen [::1]:0", "--help", "-- --model", "--max-adapters 99999999999999999999"} {
		f.Add(s)
	}
	targs, _ := tlsArgs(f, f.TempDir())
	f.Fuzz(func(t *testing.T, line string) {
		args := append(strings.Fields(line), targs...)
		o, err := ParseArgs(args)
		if err != nil {
			require.NotEmpty(t, err.Error())
			require.Equal(t, Options{}, o, "an error comes with no options")
			return
		}
		require.NotEmpty(t, o.Listen)
		require.NotEmpty(t, o.Engine.DataDir)
		require.GreaterOrEqual(t, o.Engine.MaxLoraRank, 1)
		require.GreaterOrEqual(t, o.Engine.MaxAdapters, 1)
		require.GreaterOrEqual(t, o.Engine.Threads, 0)
		require.True(t, o.Replica >= 0 && o.Replica < 1024)
		if o.Register != "" {
			require.NotEmpty(t, o.Pool)
			require.NotEmpty(t, o.JoinTokenFile)
		}
		for _, m := range o.Engine.Models {
			require.NotEmpty(t, m)
			require.NotContains(t, m, "=", "a NAME=PATH is resolved to the engine's name")
		}
	})
}
