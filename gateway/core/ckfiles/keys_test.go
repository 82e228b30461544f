package ckfiles

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

var kinds = []loopsv1.CheckpointKind{
	loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING,
	loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER,
	loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL,
}

func TestKindSegmentsAreTheirOwnInverse(t *testing.T) {
	for _, k := range kinds {
		got, ok := KindOf(KindSegment(k))
		require.True(t, ok)
		require.Equal(t, k, got)
	}
	require.Equal(t, []string{"weights", "sampler_weights", "external_weights"}, []string{KindSegment(kinds[0]), KindSegment(kinds[1]), KindSegment(kinds[2])})
	for _, s := range []string{"recovery", "", "Weights", "weights/"} {
		_, ok := KindOf(s)
		require.False(t, ok, s)
	}
}

// TestKeysRoundTrip: a checkpoint's key is <ws>/<run>/<kind>/<name>@<gen>, which ParseKey
// splits back; a record's key is its create_time's generation.
func TestKeysRoundTrip(t *testing.T) {
	for _, k := range kinds {
		key, err := Key("ws-a", "run-1", k, "c.1", 42)
		require.NoError(t, err)
		require.Equal(t, "ws-a/run-1/"+KindSegment(k)+"/c.1@42", key)
		ws, runID, kind, name, gen, ok := ParseKey(key)
		require.True(t, ok)
		require.Equal(t, []any{"ws-a", "run-1", k, "c.1", int64(42)}, []any{ws, runID, kind, name, gen})
	}
	ck := &loopsv1.Checkpoint{TrainingRunId: "run-1", Kind: kinds[1], Name: "s", CreateTime: timestamppb.New(timestamppb.Now().AsTime())}
	key, err := RecordKey("ws-a", ck)
	require.NoError(t, err)
	_, _, _, _, gen, _ := ParseKey(key)
	require.Equal(t, Generation(ck), gen)
	require.Equal(t, ck.GetCreateTime().AsTime().UnixNano(), gen)
}

// TestCheckpointKeysNeverLeaveTheStore: workspace and run ids that are not plain names, and
// records with names no save accepts, have no key (Internal: they never come from a
// client).
func TestCheckpointKeysNeverLeaveTheStore(t *testing.T) {
	for _, ws := range []string{"..", "../x", "a/b", "", ".", "@x", `a\b`, "a\x00b"} {
		_, err := Key(ws, "run-1", kinds[0], "c", 1)
		require.Equal(t, connect.CodeInternal, connect.CodeOf(err), "%q", ws)
		_, err = Key("ws", ws, kinds[0], "c", 1)
		require.Equal(t, connect.CodeInternal, connect.CodeOf(err), "%q", ws)
		_, err = SnapshotKey(ws, "run-1", 3, 1)
		require.Equal(t, connect.CodeInternal, connect.CodeOf(err), "%q", ws)
	}
	for _, name := range []string{"..", "a/b", "", "a@1"} {
		_, err := RecordKey("ws", &loopsv1.Checkpoint{TrainingRunId: "run-1", Name: name, TinkerPath: "tinker://run-1/weights/" + name})
		require.Equal(t, connect.CodeInternal, connect.CodeOf(err), "%q", name)
		require.ErrorContains(t, err, "has a bad name")
	}
}

// TestSnapshotKeysAreNotCheckpointKeys: a step snapshot's key is told apart from every
// checkpoint's, both ways.
func TestSnapshotKeysAreNotCheckpointKeys(t *testing.T) {
	key, err := SnapshotKey("ws-a", "run-1", 7, 99)
	require.NoError(t, err)
	require.Equal(t, "ws-a/run-1/recovery/step-7@99", key)
	gen, ok := IsSnapshotKey(key)
	require.True(t, ok)
	require.EqualValues(t, 99, gen)
	_, _, _, _, _, ok = ParseKey(key)
	require.False(t, ok, "a snapshot is not a checkpoint")
	for _, k := range kinds {
		ck, err := Key("ws-a", "run-1", k, "step-7", 99)
		require.NoError(t, err)
		_, ok := IsSnapshotKey(ck)
		require.False(t, ok, ck)
	}
	for _, bad := range []string{"ws/run/recovery/step-1", "ws/run/recovery/x@1", "ws/run/recovery/step-1@01", "ws/recovery/step-1@1"} {
		_, ok := IsSnapshotKey(bad)
		require.False(t, ok, bad)
	}
}

func timestampAt(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
