package gateway_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestShutdownInOrder: Close answers a long-poll at once instead of letting it outlive the
// grace, fails queued work with Unavailable "shutting down", refuses new work, is
// idempotent, and leaves no goroutine behind.
func TestShutdownInOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	url := "http://" + ln.Addr().String()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	ctx := context.Background()
	training := loopsv1connect.NewTrainingServiceClient(hc, url, withKey(keyA))
	ops := loopsv1connect.NewOperationServiceClient(hc, url, withKey(keyA))

	created := must(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}}))
	created = must(ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: created.GetId(), Timeout: durationpb.New(20 * time.Second)}))
	run := created.GetTrainingRunId()
	require.NotEmpty(t, run)
	// Queued work: seq_id 5 waits for 1–4 (a gap of 10 s).
	in, tgt, w := tokens(4)
	queued := must(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 5, LossFn: "cross_entropy", Data: []*loopsv1.Datum{{
		Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		},
	}}}))
	type polled struct {
		op  *loopsv1.Operation
		err error
		at  time.Time
	}
	poll := make(chan polled, 1)
	go func() {
		op, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: queued.GetId(), Timeout: durationpb.New(30 * time.Second)})
		poll <- polled{op, err, time.Now()}
	}()
	time.Sleep(100 * time.Millisecond) // the long-poll is waiting

	start := time.Now()
	grace, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Close(grace))
	require.Less(t, time.Since(start), 5*time.Second, "Close waited for the long-poll")
	p := <-poll
	require.NoError(t, p.err)
	require.Less(t, p.at.Sub(start), 5*time.Second)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, p.op.GetState())
	require.EqualValues(t, 14, p.op.GetError().GetCode()) // Unavailable
	require.Contains(t, p.op.GetError().GetMessage(), "shutting down")
	require.NoError(t, srv.Close(grace), "a second Close")
	if err := <-served; err != nil {
		require.ErrorIs(t, err, http.ErrServerClosed)
	}
	tr.CloseIdleConnections()
}

// TestCloseForceClosesConnectionsAfterTheGrace is issue 23's item 6: a connection still
// busy when the grace period ends (here a request whose body never arrives) is closed,
// not left to run on after Close returned.
func TestCloseForceClosesConnectionsAfterTheGrace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	keys, err := auth.ParseKeys([]string{keyA})
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(), Keys: keys})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("POST /loops.v1.SessionService/CreateSession HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + keyA +
		"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // the handler is reading the body

	grace, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = srv.Close(grace)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 4096)
	for {
		_, err = conn.Read(buf)
		if err != nil {
			break
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the connection is still open after Close returned: it was not force-closed after the grace")
	}
}
