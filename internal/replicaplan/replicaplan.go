package replicaplan

import (
	"errors"
	"fmt"
	"math"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// LoraBytesPerParam is what one LoRA parameter costs a replica: its float32 weight,
// gradient and Adam's two moments.
const LoraBytesPerParam = 4 * 4

// MinSequence is the shortest sequence a replica must hold (or the model's own maximum,
// when that is shorter): a configuration that holds less is refused.
const MinSequence = 1024

// logitsBytes is what one element of the loss head's chunk costs: its float32 logit and
// the logit's gradient.
const logitsBytes = 4 * 2

// Model is what the arithmetic needs to know of a model (the ModelInfo fields).
type Model struct {
	Name         string
	Params       int64 // the base model's parameters
	ElemBytes    int64 // bytes of a weight and of an activation element (2 for bfloat16)
	Layers       int64
	Hidden       int64
	Inter        int64
	Heads        int64
	KVHeads      int64
	HeadDim      int64
	LoraPerRank  int64 // LoRA parameters per unit of rank, every target
	LogitsChunk  int64 // elements of logits the loss head computes at a time
	MaxSeq       int64 // the model's own longest sequence
	MaxLoraRank  int64
	DeviceMemory int64 // the device memory the backend reported (0: unknown)
	WeightDType  string
}

// Config is the deployment: the memory of one device, the devices a replica has and how
// many adapters a replica keeps at once.
type Config struct {
	DeviceMemory int64 // bytes of one device (0: the backend's report)
	Devices      int64 // devices of a replica (at least 1)
	Adapters     int64 // adapters resident at once, each of the model's max LoRA rank (0: 1)
}

// Plan is the arithmetic's result, with its terms.
type Plan struct {
	WeightBytes  int64 // Params × ElemBytes, sharded over the devices (FSDP2)
	LoraBytes    int64 // Adapters × MaxLoraRank × LoraPerRank × LoraBytesPerParam, on each device
	HeadBytes    int64 // LogitsChunk × 8 on each device
	TokenBytes   int64 // the activations of one token of a sequence, on its device
	DeviceMemory int64
	Devices      int64 // the replica's devices (Config.Devices)
	// FullDevices is the number of devices a replica needs for the model's own MaxSeq (0:
	// none: one sequence of MaxSeq tokens does not fit one device whatever the sharding).
	FullDevices int64
	// MaxSeq is the longest sequence a replica of Devices holds, at most the model's.
	MaxSeq int64
	// ReplicaBytes is what the replica holds with every device on a sequence of MaxSeq.
	ReplicaBytes int64
}

// FromInfo reads a ModelInfo's planning fields; ok is false when the backend did not
// report them (the model is then not planned).
func FromInfo(m *loopsv1.ModelInfo) (Model, bool) {
	md := Model{Name: m.GetName(), Params: m.GetParameterCount(), ElemBytes: dtypeBytes(m.GetWeightDtype()),
		Layers: int64(m.GetNumLayers()), Hidden: int64(m.GetHiddenSize()), Inter: int64(m.GetIntermediateSize()),
		Heads: int64(m.GetNumAttentionHeads()), KVHeads: int64(m.GetNumKeyValueHeads()), HeadDim: int64(m.GetHeadDim()),
		LoraPerRank: m.GetLoraParametersPerRank(), LogitsChunk: m.GetLogitsChunkElements(),
		MaxSeq: int64(m.GetMaxSequenceLength()), MaxLoraRank: int64(m.GetMaxLoraRank()),
		DeviceMemory: m.GetDeviceMemoryBytes(), WeightDType: m.GetWeightDtype()}
	ok := md.Params > 0 && md.ElemBytes > 0 && md.Layers > 0 && md.Hidden > 0 && md.Inter > 0 && md.Heads > 0 &&
		md.KVHeads > 0 && md.HeadDim > 0 && md.LoraPerRank > 0 && md.LogitsChunk > 0 && md.MaxSeq > 0
	return md, ok
}

func dtypeBytes(dt string) int64 {
	switch dt {
	case "float32":
		return 4
	case "float64":
		return 8
	case "bfloat16", "float16":
		return 2
	}
	return 0
}

// TokenBytes is the activations one token of a sequence keeps on its device during a
// training step: each layer's checkpointed input (Layers × Hidden), one layer's
// recomputed activations and their gradients (2 × (5 Hidden + 2 q + 2 kv + 3 Inter): the
// two norms' outputs, the residual, attention output and output projection; queries,
// attention values; keys and values; gate, up and their product), and the final hidden
// state and its gradient (2 Hidden), each of ElemBytes.
func (m Model) TokenBytes() int64 {
	q, kv := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	layer := 5*m.Hidden + 2*q + 2*kv + 3*m.Inter
	return m.ElemBytes * (m.Layers*m.Hidden + 2*layer + 2*m.Hidden)
}

// bound is one input's range: every product the arithmetic forms stays below 2^63 when
// each input is within its bound.
type bound struct {
	name string
	v    int64
	max  int64
}

// check says which input is out of range, if one is.
func check(bs []bound) error {
	for _, b := range bs {
		if b.v < 0 || b.v > b.max {
			return fmt.Errorf("replicaplan: %s %d is out of range (0 to %d)", b.name, b.v, b.max)
		}
	}
	return nil
}

// Make computes the plan of a model on a deployment, or says why it cannot fit: a
// replica of cfg.Devices devices that cannot hold a sequence of MinSequence tokens (or
// the model's maximum, when shorter) is refused with the arithmetic in the error.
func Make(m Model, cfg Config) (Plan, error) {
	mem := cfg.DeviceMemory
	if mem <= 0 {
		mem = m.DeviceMemory
	}
	if mem <= 0 {
		return Plan{}, errors.New("replicaplan: no device memory configured (--device-memory-gib) nor reported by the backend")
	}
	n := max(cfg.Devices, 1)
	adapters := max(cfg.Adapters, 1)
	if err := check([]bound{{"parameter_count", m.Params, 1 << 42}, {"bytes per weight", m.ElemBytes, 8},
		{"num_layers", m.Layers, 1 << 10}, {"hidden_size", m.Hidden, 1 << 18}, {"intermediate_size", m.Inter, 1 << 20},
		{"num_attention_heads", m.Heads, 1 << 10}, {"num_key_value_heads", m.KVHeads, 1 << 10}, {"head_dim", m.HeadDim, 1 << 12},
		{"lora_parameters_per_rank", m.LoraPerRank, 1 << 32}, {"max_lora_rank", m.MaxLoraRank, 1 << 12},
		{"logits_chunk_elements", m.LogitsChunk, 1 << 40}, {"max_sequence_length", m.MaxSeq, 1 << 24},
		{"device memory", mem, 1 << 50}, {"devices per replica", n, 1 << 12}, {"adapters", adapters, 1 << 8}}); err != nil {
		return Plan{}, fmt.Errorf("%s: %w", m.Name, err)
	}
	if m.MaxSeq < 1 {
		return Plan{}, fmt.Errorf("%s: replicaplan: max_sequence_length 0", m.Name)
	}
	p := Plan{WeightBytes: m.Params * m.ElemBytes, LoraBytes: adapters * m.MaxLoraRank * m.LoraPerRank * LoraBytesPerParam,
		HeadBytes: m.LogitsChunk * logitsBytes, TokenBytes: m.TokenBytes(), DeviceMemory: mem, Devices: n}
	if p.TokenBytes <= 0 {
		return Plan{}, fmt.Errorf("%s: replicaplan: the model's shape gives no activations (num_layers, hidden_size, … are 0)", m.Name)
	}
	// a device of n holds ⌈weights/n⌉ + LoRA state + head + S × TokenBytes
	shard := ceilDiv(p.WeightBytes, n)
	fixed := shard + p.LoraBytes + p.HeadBytes
	p.MaxSeq = min(m.MaxSeq, (mem-fixed)/p.TokenBytes)
	if free := mem - p.LoraBytes - p.HeadBytes - m.MaxSeq*p.TokenBytes; free > 0 {
		p.FullDevices = ceilDiv(p.WeightBytes, free)
	}
	floor := min(int64(MinSequence), m.MaxSeq)
	if p.MaxSeq < floor {
		return p, fmt.Errorf("%s does not fit a replica of %d device(s) of %s: %s; each device holds %s/%d + %s + %s = %s, "+
			"which leaves %s of its %s for activations, less than the %s (%s per token) of a %d-token sequence. %s",
			m.Name, n, gib(mem), p.terms(m, adapters), gib(p.WeightBytes), n, gib(p.LoraBytes), gib(p.HeadBytes), gib(fixed),
			gib(max(mem-fixed, 0)), gib(mem), gib(floor*p.TokenBytes), mib(p.TokenBytes), floor, p.advice())
	}
	p.ReplicaBytes = p.WeightBytes + n*(p.LoraBytes+p.HeadBytes+p.MaxSeq*p.TokenBytes)
	return p, nil
}

// terms writes the arithmetic's terms out.
func (p Plan) terms(m Model, adapters int64) string {
	return fmt.Sprintf("weights %d parameters × %d B (%s) = %s, LoRA state %d adapter(s) × rank %d × %d parameters per rank × %d B = %s "+
		"(weights sharded over the devices, LoRA state and loss head %d logits × %d B = %s on each)",
		m.Params, m.ElemBytes, m.WeightDType, gib(p.WeightBytes), adapters, m.MaxLoraRank, m.LoraPerRank, LoraBytesPerParam,
		gib(p.LoraBytes), m.LogitsChunk, logitsBytes, gib(p.HeadBytes))
}

func (p Plan) advice() string {
	if p.FullDevices > 0 {
		return fmt.Sprintf("Give each replica %d devices (--backend-opt gpus_per_replica=%d) for the model's full context, "+
			"or devices with more memory (--device-memory-gib), or a smaller --max-lora-rank.", p.FullDevices, p.FullDevices)
	}
	return "Use devices with more memory (--device-memory-gib) or a smaller --max-lora-rank: more devices shard the weights, " +
		"not the LoRA state nor a sequence's activations."
}

// Apply plans info in place for cfg: it sets devices_per_replica, device_memory_bytes,
// replica_bytes and lowers max_sequence_length to what a replica holds. A model whose
// backend does not report the planning fields, or with no device memory configured nor
// reported, is left as it is (planned false).
func Apply(info *loopsv1.ModelInfo, cfg Config) (planned bool, err error) {
	m, ok := FromInfo(info)
	if !ok || (cfg.DeviceMemory <= 0 && m.DeviceMemory <= 0) {
		return false, nil
	}
	p, err := Make(m, cfg)
	if err != nil {
		return false, err
	}
	info.DevicesPerReplica = int32(min(p.FullDevices, math.MaxInt32))
	info.DeviceMemoryBytes = p.DeviceMemory
	info.ReplicaBytes = p.ReplicaBytes
	info.MaxSequenceLength = int32(p.MaxSeq)
	return true, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// gib writes a size in GiB, or MiB below 1 GiB.
func gib(b int64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
}

func mib(b int64) string { return fmt.Sprintf("%.3f MiB", float64(b)/(1<<20)) }
