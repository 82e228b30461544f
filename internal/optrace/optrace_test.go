package optrace

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func at(base time.Time, ms int) *timestamppb.Timestamp {
	return timestamppb.New(base.Add(time.Duration(ms) * time.Millisecond))
}

type decoded struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  float64        `json:"dur"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
	OtherData map[string]any `json:"otherData"`
}

// TestEncodeDrawsEveryStage: each stage is a span of the right length on its operation's
// row, rows follow submission order, and stages an operation never reached are not drawn.
func TestEncodeDrawsEveryStage(t *testing.T) {
	base := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	full := &loopsv1.Operation{
		Id: "op-b", Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		TrainingRunId: "run-1", SeqId: 2, CreateTime: at(base, 10), DoneTime: at(base, 60),
		Timeline: &loopsv1.OperationTimeline{
			StartTime: at(base, 20), BackendStartTime: at(base, 25), BackendEndTime: at(base, 55), BatchItems: 3, Pieces: 2,
			PersistTime: at(base, 62), RetrieveTime: at(base, 70),
		},
	}
	cancelled := &loopsv1.Operation{
		Id: "op-a", Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, State: loopsv1.OperationState_OPERATION_STATE_CANCELLED,
		TrainingRunId: "run-1", SeqId: 1, CreateTime: at(base, 0), DoneTime: at(base, 5), CancelTime: at(base, 5),
		Error: &loopsv1.OperationError{Code: 1, Message: "cancelled"},
	}
	b, err := Encode("sess-1", []Track{{Name: "training run run-1", Ops: []*loopsv1.Operation{full, cancelled}}})
	require.NoError(t, err)
	var d decoded
	require.NoError(t, json.Unmarshal(b, &d))
	require.Equal(t, "sess-1", d.OtherData["session_id"])
	require.Equal(t, "2026-12-06T03:00:00Z", d.OtherData["base_time"])

	spans := map[[2]any]float64{} // (tid, name) -> dur in µs
	starts := map[[2]any]float64{}
	names := map[int]string{}
	for _, e := range d.TraceEvents {
		switch e.Ph {
		case "X":
			spans[[2]any{e.Tid, e.Name}] = e.Dur
			starts[[2]any{e.Tid, e.Name}] = e.Ts
		case "M":
			if e.Name == "thread_name" {
				names[e.Tid] = e.Args["name"].(string)
			}
		}
	}
	require.Equal(t, map[int]string{1: "seq 1 optim_step", 2: "seq 2 forward_backward"}, names, "rows in submission order")
	// The cancelled one never started: queued until it ended, nothing else.
	require.Equal(t, map[[2]any]float64{
		{1, "queued"}: 5000,
		{2, "queued"}: 10000, {2, "running"}: 40000, {2, "backend"}: 30000, {2, "persist"}: 2000, {2, "await retrieval"}: 8000,
	}, spans)
	require.Equal(t, 25000.0, starts[[2]any{2, "backend"}])
	require.Equal(t, 10000.0, starts[[2]any{2, "queued"}])
}

func TestEncodeEmpty(t *testing.T) {
	b, err := Encode("sess-1", nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"traceEvents":[],"displayTimeUnit":"ms","otherData":{"session_id":"sess-1"}}`, string(b))
}
