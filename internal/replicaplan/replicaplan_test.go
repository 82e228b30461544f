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
//	weights  8190735360 × 2 B            = 16381470720 B   (sharded over the devices)
//	LoRA     64 × 2883968 × 16 B          =  2953183232 B   (on each device)
//	head     2^28 × 8 B                   =  2147483648 B   (2 GiB, on each device)
//	token    2 × (36·4096 + 2·(5·4096 + 2·4096 + 2·1024 + 3·12288) + 2·4096)
//	       = 2 × (147456 + 135168 + 8192) =      581632 B
//	32768 tokens                          = 19058917376 B
func TestPlanMatchesHandComputation(t *testing.T) {
	m, ok := FromInfo(qwen3_8b())
	require.True(t, ok)
	require.Equal(t, int64(581632), m.TokenBytes())
	gib := int64(1 << 30)
	const lo, head, tok = 2953183232, 2147483648, 581632
	for _, tc := range []struct {
		mem, devices, maxSeq, full, replica int64
	}{
		// 80 GiB, 1 device: (85899345920 − 16381470720 − 2953183232 − 2147483648) / 581632 =
		// 110752 > 32768; full context: free 85899345920 − 2953183232 − 2147483648 −
		// 19058917376 = 61739761664 ≥ 16381470720: 1 device
		{80, 1, 32768, 1, 16381470720 + lo + head + 32768*tok},
		// 24 GiB, 1 device: (25769803776 − 16381470720 − 2953183232 − 2147483648) / 581632 =
		// 7371.8; full: free 25769803776 − 2953183232 − 2147483648 − 19058917376 = 1610219520,
		// ⌈16381470720 / 1610219520⌉ = ⌈10.17⌉ = 11
		{24, 1, 7371, 11, 16381470720 + lo + head + 7371*tok},
		// 24 GiB, 2 devices: (25769803776 − 8190735360 − 2953183232 − 2147483648) / 581632 = 21454.2
		{24, 2, 21454, 11, 16381470720 + 2*(lo+head+21454*tok)},
		// 16 GiB, 4 devices: (17179869184 − 4095367680 − 2953183232 − 2147483648) / 581632 =
		// 13726.5; the full context's 19058917376 B of activations fit no 16 GiB device
		{16, 4, 13726, 0, 16381470720 + 4*(lo+head+13726*tok)},
	} {
		p, err := Make(m, Config{DeviceMemory: tc.mem * gib, Devices: tc.devices})
		require.NoError(t, err, "%d GiB × %d", tc.mem, tc.devices)
		require.Equal(t, Plan{WeightBytes: 16381470720, LoraBytes: lo, HeadBytes: head, TokenBytes: tok,
			DeviceMemory: tc.mem * gib, Devices: tc.devices, FullDevices: tc.full, MaxSeq: tc.maxSeq, ReplicaBytes: tc.replica}, p,
			"%d GiB × %d", tc.mem, tc.devices)
	}
	// two resident adapters double the LoRA state
	p, err := Make(m, Config{DeviceMemory: 80 * gib, Devices: 1, Adapters: 2})
	require.NoError(t, err)
	require.Equal(t, int64(2*lo), p.LoraBytes)
}

// A replica that cannot hold the weights (16 GiB, 1 device: 16381470720 + 2953183232 B >
// 17179869184 B) or a MinSequence-token sequence is refused, with the arithmetic and what
// to change.
func TestPlanRefusesWhatCannotFit(t *testing.T) {
	m, _ := FromInfo(qwen3_8b())
	_, err := Make(m, Config{DeviceMemory: 16 << 30, Devices: 1})
	require.Error(t, err)
	for _, want := range []string{"Qwen/Qwen3-8B does not fit a replica of 1 device(s) of 16.00 GiB",
		"weights 8190735360 parameters × 2 B (bfloat16) = 15.26 GiB", "64 × 2883968 parameters per rank × 16 B = 2.75 GiB",
		"loss head 268435456 logits × 8 B = 2.00 GiB", "0.555 MiB per token", "1024-token sequence", "more memory"} {
		require.Contains(t, err.Error(), want)
	}
	// the model cut to 4096 tokens, 20 GiB, 1 device: 21474836480 − 16381470720 −
	// 2953183232 − 2147483648 < 0: refused; its full context leaves 21474836480 −
	// 2953183232 − 2147483648 − 4096·581632 = 13991804928 B per device for the weights'
	// shard: ⌈16381470720 / 13991804928⌉ = ⌈1.17⌉ = 2 devices
	m.MaxSeq = 4096
	_, err = Make(m, Config{DeviceMemory: 20 << 30, Devices: 1})
	require.ErrorContains(t, err, "Give each replica 2 devices (--backend-opt gpus_per_replica=2)")
	_, err = Make(m, Config{})
	require.ErrorContains(t, err, "no device memory configured")
}

func TestApplySetsTheCatalogFields(t *testing.T) {
	info := qwen3_8b()
	planned, err := Apply(info, Config{DeviceMemory: 24 << 30, Devices: 2})
	require.NoError(t, err)
	require.True(t, planned)
	want := qwen3_8b()
	want.DevicesPerReplica, want.DeviceMemoryBytes, want.MaxSequenceLength = 11, 24<<30, 21454
	want.ReplicaBytes = 16381470720 + 2*(2953183232+2147483648+21454*581632)
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
		perDevice := (p.WeightBytes+n-1)/n + p.LoraBytes + p.HeadBytes + p.MaxSeq*p.TokenBytes
		require.LessOrEqual(t, perDevice, p.DeviceMemory)
		require.Positive(t, p.ReplicaBytes)
		if fp, err := FullFinetune(m, Config{DeviceMemory: mem, Devices: devices, Adapters: adapters}); err == nil {
			perDevice := (fp.WeightBytes+fp.FullBytes+n-1)/n + fp.LoraBytes + fp.HeadBytes + min(MinSequence, maxSeq)*fp.TokenBytes
			require.Equal(t, perDevice, fp.DeviceBytes)
			require.LessOrEqual(t, fp.DeviceBytes, fp.DeviceMemory, "a full fine-tuning run that fits")
		}
		if p.FullDevices > 0 {
			full := (p.WeightBytes+p.FullDevices-1)/p.FullDevices + p.LoraBytes + p.HeadBytes + maxSeq*p.TokenBytes
			require.LessOrEqual(t, full, p.DeviceMemory, "FullDevices hold the full context")
		}
	})
}
