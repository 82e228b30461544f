package replicaplan

import (
	"fmt"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FullBytesPerParam is what full fine-tuning (LoRA rank 0) costs per parameter of the
// model, on top of the replica's frozen base: the run's own copy of the weights; below
// float32 (bf16, f16) float32 master weights, their float32 gradient and Adam's two float32
// moments (ElemBytes + 16); at float32 or wider the weights are their own master, with a
// gradient and two moments of their width (4 × ElemBytes).
func (m Model) FullBytesPerParam() int64 {
	if m.ElemBytes < 4 {
		return m.ElemBytes + 4 + 4 + 2*4
	}
	return 4 * m.ElemBytes
}

// FullPlan is the arithmetic of one full fine-tuning run on a replica.
type FullPlan struct {
	Plan
	// FullBytes is the run's state: Params × FullBytesPerParam, sharded over the devices
	// with the frozen weights.
	FullBytes int64
	// DeviceBytes is what each device holds with a sequence of MinSequence tokens (or the
	// model's maximum, when shorter).
	DeviceBytes int64
}

// FullFinetune computes what a full fine-tuning run of model m needs on a replica of cfg,
// or says why it cannot fit with the arithmetic: each device holds ⌈(frozen weights + the
// run's state) / devices⌉ + the LoRA state of the resident adapters + the loss head's
// chunk + the activations of a MinSequence-token sequence (or the model's maximum, when
// shorter).
func FullFinetune(m Model, cfg Config) (FullPlan, error) {
	if _, err := Make(m, cfg); err != nil {
		return FullPlan{}, err
	}
	// Make checked every input, so the sums below stay below 2^63 (Params < 2^42, 32 B).
	mem := cfg.DeviceMemory
	if mem <= 0 {
		mem = m.DeviceMemory
	}
	n := max(cfg.Devices, 1)
	adapters := max(cfg.Adapters, 1)
	p := FullPlan{Plan: Plan{WeightBytes: m.Params * m.ElemBytes, LoraBytes: adapters * m.MaxLoraRank * m.LoraPerRank * LoraBytesPerParam,
		HeadBytes: m.LogitsChunk * logitsBytes, TokenBytes: m.TokenBytes(), DeviceMemory: mem, Devices: n}}
	p.FullBytes = m.Params * m.FullBytesPerParam()
	floor := min(int64(MinSequence), m.MaxSeq)
	shard := ceilDiv(p.WeightBytes+p.FullBytes, n)
	p.DeviceBytes = shard + p.LoraBytes + p.HeadBytes + floor*p.TokenBytes
	if p.DeviceBytes <= mem {
		return p, nil
	}
	// the devices that would hold it: the sharded part over what is left of each device
	advice := "more devices do not help: the LoRA state, loss head and one sequence's activations alone fill a device; train a LoRA adapter (rank 1 or more)"
	if free := mem - p.LoraBytes - p.HeadBytes - floor*p.TokenBytes; free > 0 {
		need := ceilDiv(p.WeightBytes+p.FullBytes, free)
		advice = fmt.Sprintf("a replica of %d such devices would hold it (--backend-opt gpus_per_replica=%d), or train a LoRA adapter (rank 1 or more)", need, need)
	}
	return p, fmt.Errorf("full fine-tuning (rank 0) of %s does not fit a replica of %d device(s) of %s: "+
		"frozen weights %d parameters × %d B (%s) = %s, plus the run's weights, gradients, master weights and Adam moments "+
		"%d parameters × %d B = %s, sharded over %d device(s): %s per device; with LoRA state %s, loss head %s and the activations "+
		"of a %d-token sequence %s (%s per token), each device needs %s, over its %s; %s",
		m.Name, n, gib(mem), m.Params, m.ElemBytes, m.WeightDType, gib(p.WeightBytes), m.Params, m.FullBytesPerParam(),
		gib(p.FullBytes), n, gib(shard), gib(p.LoraBytes), gib(p.HeadBytes), floor, gib(floor*p.TokenBytes), mib(p.TokenBytes),
		gib(p.DeviceBytes), gib(mem), advice)
}

// CheckFullFinetune refuses a full fine-tuning run of a served model (info, as the catalog
// holds it) that a replica of cfg cannot hold. A model whose backend does not report the
// planning fields, or with no device memory configured nor reported, is not planned (nil).
func CheckFullFinetune(info *loopsv1.ModelInfo, cfg Config) error {
	m, ok := FromInfo(info)
	if !ok || (cfg.DeviceMemory <= 0 && m.DeviceMemory <= 0) {
		return nil
	}
	_, err := FullFinetune(m, cfg)
	return err
}
