package replicaplan

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// qwen3_8b is Qwen3-8B's shape in bfloat16: 36 layers of width 4096, MLP 12288, 32 query
// and 8 key/value heads of 128, vocabulary 151936 (untied), LoRA on the seven layer
// targets and lm_head, the torch worker's GPU loss-head chunk (2^28 logits).
func qwen3_8b() *loopsv1.ModelInfo {
	// LoRA per rank: per layer q 4096+4096, k and v 4096+1024, o 4096+4096, gate and up
	// 4096+12288, down 12288+4096 = 75776; × 36 = 2727936; lm_head 4096+151936 = 156032.
	return &loopsv1.ModelInfo{Name: "Qwen/Qwen3-8B", MaxSequenceLength: 32768, VocabSize: 151936, HiddenSize: 4096,
		MaxLoraRank: 64, ParameterCount: 8190735360, WeightDtype: "bfloat16", NumLayers: 36, IntermediateSize: 12288,
		NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, LoraParametersPerRank: 2883968, LogitsChunkElements: 1 << 28}
}

// The figures below were computed by hand (docs/scale-out.md's formulas):
//
//	weights  8190735360 × 2 B            = 16381470720 B
//	LoRA     64 × 2883968 × 16 B          =  2953183232 B   (sharded: 19334653952 B)
//	head     2^28 × 8 B                   =  2147483648 B   (2 GiB, on each device)
//	token    2 × (36·4096 + 2·(5·4096 + 2·4096 + 2·1024 + 3·12288) + 2·4096)
//	       = 2 × (147456 + 135168 + 8192) =      581632 B
//	32768 tokens                          = 19058917376 B
func TestPlanMatchesHandComputation(t *testing.T) {
	m, ok := FromInfo(qwen3_8b())
	require.True(t, ok)
	require.Equal(t, int64(581632), m.TokenBytes())
	gib := int64(1 << 30)
	for _, tc := range []struct {
		mem, devices, maxSeq, full, replica int64
	}{
		// 80 GiB, 1 device: (85899345920 − 19334653952 − 2147483648) / 581632 = 110752 > 32768;
		// full context: free 85899345920 − 2147483648 − 19058917376 = 64692944896 ≥ 19334653952: 1 device
		{80, 1, 32768, 1, 19334653952 + 2147483648 + 19058917376},
		// 24 GiB, 1 device: (25769803776 − 19334653952 − 2147483648) / 581632 = 7371.8;
		// full: free 4563402752, ⌈19334653952 / 4563402752⌉ = ⌈4.24⌉ = 5
		{24, 1, 7371, 5, 19334653952 + 2147483648 + 7371*581632},
		// 24 GiB, 2 devices: (25769803776 − 9667326976 − 2147483648) / 581632 = 23992.6
		{24, 2, 23992, 5, 19334653952 + 2*(2147483648+23992*581632)},
		// 16 GiB, 4 devices: (17179869184 − 4833663488 − 2147483648) / 581632 = 17534.6; the
		// full context (19058917376 B of activations) fits no 16 GiB device
		{16, 4, 17534, 0, 19334653952 + 4*(2147483648+17534*581632)},
	} {
		p, err := Make(m, Config{DeviceMemory: tc.mem * gib, Devices: tc.devices})
		require.NoError(t, err, "%d GiB × %d", tc.mem, tc.devices)
		require.Equal(t, Plan{WeightBytes: 16381470720, LoraBytes: 2953183232, HeadBytes: 2147483648, TokenBytes: 581632,
			DeviceMemory: tc.mem * gib, Devices: tc.devices, FullDevices: tc.full, MaxSeq: tc.maxSeq, ReplicaBytes: tc.replica}, p,
			"%d GiB × %d", tc.mem, tc.devices)
	}
	// two resident adapters double the LoRA state
	p, err := Make(m, Config{DeviceMemory: 80 * gib, Devices: 1, Adapters: 2})
	require.NoError(t, err)
	require.Equal(t, int64(2*2953183232), p.LoraBytes)
}

// A replica that cannot hold the weights (16 GiB, 1 device: 19334653952 B > 17179869184 B)
// or a MinSequence-token sequence is refused, with the arithmetic and what to change.
func TestPlanRefusesWhatCannotFit(t *testing.T) {
	m, _ := FromInfo(qwen3_8b())
	_, err := Make(m, Config{DeviceMemory: 16 << 30, Devices: 1})
	require.Error(t, err)
	for _, want := range []string{"Qwen/Qwen3-8B does not fit a replica of 1 device(s) of 16.00 GiB",
		"weights 8190735360 parameters × 2 B (bfloat16) = 15.26 GiB", "64 × 2883968 parameters per rank × 16 B = 2.75 GiB",
		"loss head 268435456 logits × 8 B = 2.00 GiB", "0.555 MiB per token", "1024-token sequence", "more memory"} {
		require.Contains(t, err.Error(), want)
	}
	// 20 GiB, 1 device: 21474836480 − 19334653952 − 2147483648 < 0: refused; the full
	// context leaves 21474836480 − 2147483648 − 19058917376 = 268435456 B per device for
	// the sharded 19334653952 B: ⌈72.03⌉ = 73 devices
	_, err = Make(m, Config{DeviceMemory: 20 << 30, Devices: 1})
	require.ErrorContains(t, err, "Give each replica 73 devices (--backend-opt gpus_per_replica=73)")
	_, err = Make(m, Config{})
	require.ErrorContains(t, err, "no device memory configured")
}

func TestApplySetsTheCatalogFields(t *testing.T) {
	info := qwen3_8b()
	planned, err := Apply(info, Config{DeviceMemory: 24 << 30, Devices: 2})
	require.NoError(t, err)
	require.True(t, planned)
	want := qwen3_8b()
	want.DevicesPerReplica, want.DeviceMemoryBytes, want.MaxSequenceLength = 5, 24<<30, 23992
	want.ReplicaBytes = 19334653952 + 2*(2147483648+23992*581632)
	require.Empty(t, cmp.Diff(want, info, protocmp.Transform()))
	// a backend that does not report the model's size is not planned
	bare := &loopsv1.ModelInfo{Name: "x", MaxSequenceLength: 4096}
	planned, err = Apply(bare, Config{DeviceMemory: 1 << 30, Devices: 1})
	require.NoError(t, err)
	require.False(t, planned)
	require.Equal(t, int32(4096), bare.GetMaxSequenceLength())
}

// FuzzMake: any inputs give a plan or an error, never a panic or an overflow; a plan's
// replica holds what it says on each device, and no longer a sequence than the model's.
func FuzzMake(f *testing.F) {
	q := qwen3_8b()
	f.Add(q.GetParameterCount(), int64(2), int64(36), int64(4096), int64(12288), int64(32), int64(8), int64(128),
		q.GetLoraParametersPerRank(), int64(1<<28), int64(32768), int64(64), int64(24<<30), int64(2), int64(1))
	f.Add(int64(3279616), int64(4), int64(4), int64(256), int64(768), int64(4), int64(2), int64(64), int64(20224),
		int64(131072), int64(2048), int64(64), int64(1<<50), int64(1<<12), int64(1<<8))
	f.Add(int64(-1), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, params, elem, layers, hidden, inter, heads, kv, hd, lora, chunk, maxSeq, rank, mem, devices, adapters int64) {
		m := Model{Name: "m", Params: params, ElemBytes: elem, Layers: layers, Hidden: hidden, Inter: inter, Heads: heads,
			KVHeads: kv, HeadDim: hd, LoraPerRank: lora, LogitsChunk: chunk, MaxSeq: maxSeq, MaxLoraRank: rank}
		p, err := Make(m, Config{DeviceMemory: mem, Devices: devices, Adapters: adapters})
		if err != nil {
			return
		}
		require.Positive(t, p.MaxSeq)
		require.LessOrEqual(t, p.MaxSeq, maxSeq)
		n := p.Devices
		perDevice := (p.WeightBytes+p.LoraBytes+n-1)/n + p.HeadBytes + p.MaxSeq*p.TokenBytes
		require.LessOrEqual(t, perDevice, p.DeviceMemory)
		require.Positive(t, p.ReplicaBytes)
		if p.FullDevices > 0 {
			full := (p.WeightBytes+p.LoraBytes+p.FullDevices-1)/p.FullDevices + p.HeadBytes + maxSeq*p.TokenBytes
			require.LessOrEqual(t, full, p.DeviceMemory, "FullDevices hold the full context")
		}
	})
}
