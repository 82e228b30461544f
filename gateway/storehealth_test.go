package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
	"github.com/loops-dev/loops/gateway/store"
)

// health GETs /healthz and returns its status and JSON body.
func health(t *testing.T, url string) (int, map[string]string) {
	t.Helper()
	res, err := http.Get(url + "/healthz")
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
	var m map[string]string
	require.NoError(t, json.Unmarshal(b, &m), "body %s", b)
	return res.StatusCode, m
}

func TestHealthzAndMetricsSQLite(t *testing.T) {
	url := startStoreServer(t, openSQLite(t))
	code, body := health(t, url)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]string{"status": "ok", "role": "leader", "store": "ok", "store_kind": "sqlite", "checkpoint_store": "ok", "checkpoint_store_kind": "local"}, body)

	m := metrics(t, url)
	require.Contains(t, m, `loops_store_info{kind="sqlite"} 1`)
	require.NotContains(t, m, "loops_store_pool_", "pool metrics are PostgreSQL's only")
	require.Contains(t, m, `loops_store_up{store="metadata"} 1`)
	require.Contains(t, m, `loops_store_up{store="checkpoint"} 1`)
	require.Contains(t, m, `loops_store_probe_failures_total{store="metadata"} 0`)
	// The local checkpoint folder's file system, as statfs tells it.
	total, avail := scrapeValue(t, m, "loops_checkpoint_store_capacity_bytes"), scrapeValue(t, m, "loops_checkpoint_store_available_bytes")
	require.Positive(t, total)
	require.Positive(t, avail)
	require.LessOrEqual(t, avail, total)
	require.Contains(t, m, `loops_backend_workers{state="up"} 0`, "the embedded engine has no workers")
	require.Contains(t, m, `loops_backend_workers{state="down"} 0`)
}

// scrapeValue is the value of the unlabelled metric name in the text of /metrics.
func scrapeValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(t, err, line)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

func TestHealthzAndMetricsPostgres(t *testing.T) {
	url := startStoreServer(t, openPostgres(t))
	code, body := health(t, url)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]string{"status": "ok", "role": "leader", "store": "ok", "store_kind": "postgres", "checkpoint_store": "ok", "checkpoint_store_kind": "local"}, body)

	m := metrics(t, url)
	require.Contains(t, m, `loops_store_info{kind="postgres"} 1`)
	for _, name := range []string{
		"loops_store_pool_total_conns", "loops_store_pool_idle_conns", "loops_store_pool_acquired_conns",
		"loops_store_pool_constructing_conns", "loops_store_pool_acquires_total",
		"loops_store_pool_acquire_duration_seconds_total", "loops_store_pool_empty_acquires_total",
		"loops_store_pool_canceled_acquires_total",
	} {
		require.Regexp(t, "(?m)^"+name+" [0-9.e+-]+$", m)
	}
	require.Regexp(t, `(?m)^loops_store_pool_max_conns 16$`, m)
	require.Regexp(t, `(?m)^# TYPE loops_store_pool_acquires_total counter$`, m)
	require.Regexp(t, `(?m)^# TYPE loops_store_pool_idle_conns gauge$`, m)
	require.NotRegexp(t, `(?m)^loops_store_pool_acquires_total 0$`, m, "the ping acquired a connection")
}

// failingStore is a store whose ping fails with err.
type failingStore struct {
	store.Store
	err error
}

func (f failingStore) Ping(context.Context) error { return f.err }

func TestHealthzNamesStoreFailure(t *testing.T) {
	for _, tc := range []struct {
		err         error
		store, text string
	}{
		{fmt.Errorf("store: ping: %w", context.DeadlineExceeded), "timeout", "did not answer a ping within 2s"},
		{errors.New("store: ping: connection refused"), "error", "ping failed"},
	} {
		t.Run(tc.store, func(t *testing.T) {
			url := startStoreServer(t, failingStore{openSQLite(t), tc.err})
			code, body := health(t, url)
			require.Equal(t, http.StatusServiceUnavailable, code)
			require.Equal(t, "unavailable", body["status"])
			require.Equal(t, tc.store, body["store"])
			require.Equal(t, "other", body["store_kind"])
			require.Contains(t, body["error"], tc.text)
			require.NotContains(t, body["error"], "refused", "details stay in the log")
			m := metrics(t, url)
			require.Contains(t, m, `loops_store_info{kind="other"} 1`)
			require.Contains(t, m, `loops_store_up{store="metadata"} 0`)
			require.Contains(t, m, `loops_store_up{store="checkpoint"} 1`)
			require.NotContains(t, m, `loops_store_probe_failures_total{store="metadata"} 0`)
		})
	}

	t.Run("closed", func(t *testing.T) {
		st := openSQLite(t)
		url := startStoreServer(t, st)
		require.NoError(t, st.Close())
		code, body := health(t, url)
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, map[string]string{"status": "unavailable", "role": "leader", "store": "closed", "store_kind": "sqlite",
			"checkpoint_store": "ok", "checkpoint_store_kind": "local",
			"error": "the sqlite store is closed (the server is shutting down)"}, body)
	})
}

// failingCheckpoints is a local checkpoint store whose lookups fail with err.
type failingCheckpoints struct {
	ckstore.Store
	ckstore.LocalDirs
	err error
}

func (f failingCheckpoints) Stat(context.Context, string) (*ckstore.Manifest, error) {
	return nil, f.err
}

func TestHealthzNamesCheckpointStoreFailure(t *testing.T) {
	for _, tc := range []struct {
		err         error
		state, text string
	}{
		{fmt.Errorf("get: %w", context.DeadlineExceeded), "timeout", "did not answer a lookup within 2s"},
		{errors.New("get: 403 Forbidden: secret-bucket-detail"), "error", "lookup failed"},
	} {
		t.Run(tc.state, func(t *testing.T) {
			local, err := ckstore.NewLocal(t.TempDir(), ckstore.Options{})
			require.NoError(t, err)
			url := "http://" + startServerWith(t, func(c *gateway.Config) {
				c.Core.CheckpointStore = failingCheckpoints{local, local.(ckstore.LocalDirs), tc.err}
			})
			code, body := health(t, url)
			require.Equal(t, http.StatusServiceUnavailable, code)
			require.Equal(t, "unavailable", body["status"])
			require.Equal(t, "ok", body["store"])
			require.Equal(t, tc.state, body["checkpoint_store"])
			require.Equal(t, "local", body["checkpoint_store_kind"])
			require.Contains(t, body["error"], tc.text)
			require.NotContains(t, body["error"], "secret", "details stay in the log")
			m := metrics(t, url)
			require.Contains(t, m, `loops_store_up{store="checkpoint"} 0`)
			require.Contains(t, m, `loops_store_up{store="metadata"} 1`)
		})
	}
}

func TestHealthzReportsAnS3CheckpointStore(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	cks, err := ckstore.Open(t.Context(), "s3://"+srv.NewBucket(t)+"/loops", ckstore.Options{})
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.CheckpointStore = cks })
	code, body := health(t, url)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body["checkpoint_store"])
	require.Equal(t, "s3", body["checkpoint_store_kind"])
}
