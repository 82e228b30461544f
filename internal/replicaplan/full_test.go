package replicaplan

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Full fine-tuning of Qwen3-8B in bfloat16, computed by hand:
//
//	frozen weights 8190735360 × 2 B           =  16381470720 B
//	run's state    8190735360 × (2+4+4+8) B  = 147433236480 B  (copy, master, grad, m, v)
//	sharded sum                               = 163814707200 B
//	per device:    LoRA 2953183232 + head 2147483648 + 1024 × 581632 (595591168) = 5696258048 B
//	80 GiB = 85899345920 B: free for the shards 80203087872 B, ⌈163814707200 / 80203087872⌉ = 3 devices
func TestFullFinetuneMatchesHandComputation(t *testing.T) {
	m, ok := FromInfo(qwen3_8b())
	require.True(t, ok)
	require.Equal(t, int64(18), m.FullBytesPerParam())
	gib := int64(1 << 30)
	p, err := FullFinetune(m, Config{DeviceMemory: 80 * gib, Devices: 4})
	require.NoError(t, err)
	require.Equal(t, int64(147433236480), p.FullBytes)
	require.Equal(t, int64(163814707200/4+5696258048), p.DeviceBytes)
	for _, n := range []int64{1, 2} {
		_, err = FullFinetune(m, Config{DeviceMemory: 80 * gib, Devices: n})
		require.Error(t, err, "%d devices", n)
		for _, want := range []string{"full fine-tuning (rank 0) of Qwen/Qwen3-8B does not fit a replica of", "of 80.00 GiB",
			"frozen weights 8190735360 parameters × 2 B (bfloat16) = 15.26 GiB",
			"8190735360 parameters × 18 B = 137.31 GiB", "1024-token sequence",
			"a replica of 3 such devices would hold it (--backend-opt gpus_per_replica=3)"} {
			require.Contains(t, err.Error(), want)
		}
	}
	// float32: the weights are their own master: 4 × 4 B per parameter
	m.ElemBytes, m.WeightDType = 4, "float32"
	require.Equal(t, int64(16), m.FullBytesPerParam())
	// a replica that cannot hold the frozen weights for LoRA runs is Make's refusal
	_, err = FullFinetune(m, Config{DeviceMemory: 16 * gib, Devices: 1})
	require.ErrorContains(t, err, "Qwen/Qwen3-8B does not fit a replica of 1 device(s)")
	// no memory configured: not planned
	info := qwen3_8b()
	require.NoError(t, CheckFullFinetune(info, Config{}))
	require.Error(t, CheckFullFinetune(info, Config{DeviceMemory: 80 * gib, Devices: 1}))
	require.NoError(t, CheckFullFinetune(info, Config{DeviceMemory: 80 * gib, Devices: 4}))
}
