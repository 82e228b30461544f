package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestLongPolls holds 2,000 Tinker retrieve_future long-polls, each on its own connection,
// on one operation, and measures how long the last of them takes to return once it is done.
func TestLongPolls(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the long-poll benchmark")
	}
	const polls = 2000
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(ctx, ln, gateway.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	defer srv.Close(context.Background())
	url := "http://" + ln.Addr().String()
	key := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", "tml-bench")
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, key)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, key)
	op, err := training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 8, TrainMlp: true}})
	require.NoError(t, err)
	op, err = ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(20 * time.Second)})
	require.NoError(t, err)
	run := op.GetTrainingRun().GetId()
	// A forward pass big enough to outlast the set-up of every poll.
	var data []*loopsv1.Datum
	for range 16 {
		data = append(data, datum(512))
	}
	fb, err := training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, Data: data, LossFn: "cross_entropy", ForwardOnly: true})
	require.NoError(t, err)

	var started, succeeded atomic.Int64
	var firstStarts sync.Map // goroutine -> start time of its first poll
	var wg sync.WaitGroup
	done := make(chan time.Time, polls)
	for range polls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := new(int)
			firstStarts.Store(me, time.Now())
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			for {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/v1/retrieve_future", bytes.NewReader(fmt.Appendf(nil, `{"request_id":%q}`, fb.GetId())))
				req.Header.Set("X-API-Key", "tml-bench")
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/x-protobuf")
				started.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var v map[string]any
				if json.Unmarshal(b, &v) == nil && v["type"] == "try_again" {
					continue
				}
				if resp.StatusCode == http.StatusOK {
					succeeded.Add(1)
					done <- time.Now()
				}
				return
			}
		}()
	}
	wg.Wait()
	close(done)
	got, err := ops.GetOperation(ctx, &loopsv1.GetOperationRequest{Id: fb.GetId()})
	require.NoError(t, err)
	finished := got.GetDoneTime().AsTime()
	var last time.Time
	for d := range done {
		if d.After(last) {
			last = d
		}
	}
	held := 0
	firstStarts.Range(func(_, v any) bool {
		if ts, ok := v.(time.Time); ok && ts.Before(finished) {
			held++
		}
		return true
	})
	require.EqualValues(t, polls, succeeded.Load())
	t.Logf("%d concurrent retrieve_future long-polls (one connection each, %d requests in all, %d of them waiting when the operation finished): all returned the result; the last %v after it finished",
		polls, started.Load(), held, last.Sub(finished).Round(time.Millisecond))
}
