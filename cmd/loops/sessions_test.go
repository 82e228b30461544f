package main

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
)

// A workspace allowed one live run gets its place back from `loops runs unload` and from
// `loops sessions end`, without waiting for the session's TTL.
func TestUnloadAndEndFreeTheWorkspacesRunPlace(t *testing.T) {
	const key = "tml-sessions-cli"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{key + "=team"})
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("default:\n  max_concurrent_runs: 1\n"))
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys, Core: core.Options{Policy: pol}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	url := "http://" + ln.Addr().String()
	cf := clientFlags{url: url, apiKey: key}
	sessions := loopsv1connect.NewSessionServiceClient(http.DefaultClient, url, cf.options()...)
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, cf.options()...)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, cf.options()...)
	ctx := t.Context()

	sess, err := sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{SdkVersion: "0.38.0"})
	require.NoError(t, err)
	newRun := func() (string, error) {
		op, err := training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
			SessionId: sess.GetId(), BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true}})
		if err != nil {
			return "", err
		}
		for op.GetState() == loopsv1.OperationState_OPERATION_STATE_PENDING || op.GetState() == loopsv1.OperationState_OPERATION_STATE_RUNNING {
			op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId()})
			require.NoError(t, err)
		}
		require.Nil(t, op.GetError())
		return op.GetTrainingRunId(), nil
	}
	run, err := newRun()
	require.NoError(t, err)
	_, err = newRun()
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "the policy allows one live run")

	out, code := runLoops(t, "runs", "unload", run, "--url", url, "--api-key", key)
	require.Equal(t, 0, code)
	require.Equal(t, "run "+run+" unloaded\n", out)
	_, err = newRun()
	require.NoError(t, err, "the unloaded run no longer holds the place")

	out, code = runLoops(t, "sessions", "list", "--url", url, "--api-key", key)
	require.Equal(t, 0, code)
	require.Contains(t, out, sess.GetId()+"  ")
	require.Contains(t, out, "live")

	out, code = runLoops(t, "sessions", "end", sess.GetId(), "--url", url, "--api-key", key)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "session "+sess.GetId()+" ended")
	got, err := sessions.GetSession(ctx, &loopsv1.GetSessionRequest{Id: sess.GetId()})
	require.NoError(t, err)
	require.True(t, got.GetExpired())

	// Its runs are gone from the workspace's live count: a new session's run fits.
	sess, err = sessions.CreateSession(ctx, &loopsv1.CreateSessionRequest{SdkVersion: "0.38.0"})
	require.NoError(t, err)
	_, err = newRun()
	require.NoError(t, err)

	_, code = runLoops(t, "runs", "unload", "run-none", "--url", url, "--api-key", key)
	require.Equal(t, 1, code)
}
