package gateway

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/internal/otlptest"
	"github.com/loops-dev/loops/internal/telemetry"
)

// startGateway runs a gateway on the reference engine (its kernel goroutines: beOpts) until
// the test ends and returns its URL. Tracing is as telemetry stands when it is made.
func startGateway(t *testing.T, beOpts map[string]string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), BackendConfig: backends.Config{Options: beOpts}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return "http://" + ln.Addr().String()
}

// TestTracingOverhead measures what OpenTelemetry tracing adds to Tinker's forward_backward
// and optim_step: two gateways in this process, one made with tracing off (no OTEL_*
// variables) and one with it on at sampling 1.0 (OTEL_TRACES_SAMPLER=always_on), exporting
// over OTLP http/protobuf to a receiver in this process that decodes every span
// (internal/otlptest), called in alternating blocks of 10 so that drift on the machine
// falls on both alike.
func TestTracingOverhead(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the tracing overhead benchmark")
	}
	var beOpts map[string]string
	if n := os.Getenv("LOOPS_BENCH_THREADS"); n != "" {
		beOpts = map[string]string{"threads": n}
	}
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	require.False(t, telemetry.Configured())
	off := startGateway(t, beOpts)

	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.HTTPEndpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	shutdown, err := telemetry.Setup(t.Context(), "")
	require.NoError(t, err)
	require.True(t, telemetry.Enabled())
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	on := startGateway(t, beOpts)

	d := datum(32)
	clients := []*tinkerClient{newTinkerClient(t, off, d, nil), newTinkerClient(t, on, d, nil)}
	var fb, opt [2]stats
	const block = 10
	for b := range (iterations+10)/block + 1 {
		for which, c := range clients {
			for range block {
				t0, c0 := time.Now(), cpuTime()
				c.forwardBackward()
				t1, c1 := time.Now(), cpuTime()
				c.optimStep()
				if b > 0 { // the first block warms up
					fb[which].add(t1.Sub(t0))
					opt[which].add(time.Since(t1))
					fb[which].cpu += c1 - c0
					opt[which].cpu += cpuTime() - c1
				}
			}
		}
	}
	require.NoError(t, shutdown(t.Context()))
	spans := len(recv.Spans())
	require.Positive(t, spans, "the traced gateway exported its spans")

	row := func(name string, s, base *stats) {
		n := time.Duration(len(s.d))
		t.Logf("%-32s p50 %8.3f ms  p99 %8.3f ms  vs off p50 %+7.3f ms  CPU/op %6.3f ms (%+6.3f)", name,
			ms(s.pct(0.5)), ms(s.pct(0.99)), ms(s.pct(0.5))-ms(base.pct(0.5)), ms(s.cpu/n), ms(s.cpu/n)-ms(base.cpu/n))
	}
	t.Logf("%d iterations each, alternating blocks of %d, 1 datum x 32 tokens, loops/tiny, LoRA rank 8 (attn+mlp); %d spans exported",
		len(opt[0].d), block, spans)
	row("optim_step, tracing off", &opt[0], &opt[0])
	row("optim_step, tracing on (1.0)", &opt[1], &opt[0])
	row("forward_backward, tracing off", &fb[0], &fb[0])
	row("forward_backward, tracing on", &fb[1], &fb[0])
}
