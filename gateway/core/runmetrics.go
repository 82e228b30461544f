package core

import (
	"context"
	"math"
	"time"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Run metrics (docs/semantics.md, "Run metrics"). For every forward_backward and optim_step
// that succeeds, the lane builds a compact loops.v1.StepMetrics record from the request
// and the backend's result (no extra backend call; a pass over the tokens of the request,
// cheap arithmetic only) and queues it on the persister before the operation's outcome, so
// both go out in the same journal write and are committed to the store in its batches
// (store.ApplyBatch bounds and downsamples each run's records). GetTrainingRunMetrics reads
// them back.

// maxMetricsPoints caps GetTrainingRunMetrics' max_points.
const maxMetricsPoints = store.MaxStepMetricsPerRun

// rlLosses are the losses whose requests carry the sampler's logprobs and advantages.
var rlLosses = map[string]bool{"importance_sampling": true, "ppo": true, "cispo": true, "dro": true, "gspo": true}

// fbStepMetrics computes a forward_backward's record (without run, seq_id, step or time)
// from its request item and the backend's result. tokens is the request's model input
// token count.
func fbStepMetrics(item *backendv1.ForwardBackwardItem, res *loopsv1.ForwardBackwardResult, tokens int, backend time.Duration) *loopsv1.StepMetrics {
	m := &loopsv1.StepMetrics{
		Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Count: 1,
		BackendSeconds: backend.Seconds(), LossFn: item.GetLossFn(),
		LossSum: res.GetMetrics()["loss:sum"], Tokens: int64(tokens), Examples: int64(len(item.GetData())),
	}
	lossFn := item.GetLossFn()
	var rl *rlAccum
	if rlLosses[lossFn] {
		rl = &rlAccum{ratioMin: math.Inf(1), ratioMax: math.Inf(-1)}
		if lossFn == "ppo" || lossFn == "cispo" {
			c, _ := semantics.LossConfig(lossFn)
			for k, v := range item.GetLossFnConfig() {
				c[k] = v
			}
			rl.clip, rl.lo, rl.hi = true, c["clip_low_threshold"], c["clip_high_threshold"]
		}
	}
	outs := res.GetOutputs()
	for j, d := range item.GetData() {
		in := d.GetLossFnInputs()
		switch {
		case lossFn == "cross_entropy" && in["weights"] != nil:
			for _, w := range in["weights"].GetFloat32Data() {
				if w != 0 {
					m.LossTokens++
				}
			}
		case rl != nil && in["logprobs"] != nil && in["advantages"] != nil:
			var lp []float32
			if j < len(outs) {
				lp = outs[j].GetOutputs()["logprobs"].GetFloat32Data()
			}
			m.LossTokens += rl.add(in["logprobs"].GetFloat32Data(), in["advantages"].GetFloat32Data(), lp)
		default:
			m.LossTokens += int64(len(in["target_tokens"].GetInt64Data()))
		}
	}
	if m.LossTokens > 0 {
		m.LossMean = m.LossSum / float64(m.LossTokens)
	}
	if rl != nil && rl.examples > 0 {
		m.Rl = rl.result()
	}
	return m
}

// rlAccum accumulates the RL health signals over the sampled tokens of a request, in
// float64.
type rlAccum struct {
	clip             bool
	lo, hi           float64
	n                int64 // sampled tokens with the trainer's logprob (ratio signals)
	an               int64 // sampled tokens (advantage signals)
	examples, zeroEx int64
	k1, k3           float64
	ratio, ratio2    float64
	ratioMin         float64
	ratioMax         float64
	adv, adv2        float64
	clipped          int64
}

// add accumulates one example: q the sampler's logprobs, a the advantages, lp the trainer's
// logprobs of the same targets (nil or of another length: the example's ratio signals are
// skipped). It returns the example's sampled tokens.
func (s *rlAccum) add(q, a, lp []float32) int64 {
	s.examples++
	zero := true
	for _, v := range a {
		if v != 0 {
			zero = false
			break
		}
	}
	if zero {
		s.zeroEx++
	}
	var n int64
	withLP := len(lp) == len(q) && len(q) == len(a)
	for i := range min(len(q), len(a)) {
		if q[i] == 0 && a[i] == 0 {
			continue // a prompt position
		}
		n++
		s.an++
		av := float64(a[i])
		s.adv += av
		s.adv2 += av * av
		if !withLP {
			continue
		}
		d := float64(lp[i]) - float64(q[i]) // log r
		r := math.Exp(d)
		s.k1 -= d
		s.k3 += (r - 1) - d
		s.ratio += r
		s.ratio2 += r * r
		s.ratioMin = min(s.ratioMin, r)
		s.ratioMax = max(s.ratioMax, r)
		if s.clip && (r < s.lo || r > s.hi) {
			s.clipped++
		}
		s.n++
	}
	return n
}

func (s *rlAccum) result() *loopsv1.RLStepMetrics {
	m := &loopsv1.RLStepMetrics{Tokens: s.an, ZeroAdvantageFraction: float64(s.zeroEx) / float64(s.examples)}
	if s.an > 0 {
		n := float64(s.an)
		m.AdvantageMean = s.adv / n
		m.AdvantageStd = math.Sqrt(max(s.adv2/n-m.AdvantageMean*m.AdvantageMean, 0))
	}
	if s.n > 0 {
		n := float64(s.n)
		m.KlSampleTrainK1, m.KlSampleTrainK3 = s.k1/n, s.k3/n
		m.RatioMean, m.RatioMin, m.RatioMax = s.ratio/n, s.ratioMin, s.ratioMax
		m.RatioStd = math.Sqrt(max(s.ratio2/n-m.RatioMean*m.RatioMean, 0))
		if s.clip {
			m.ClipFraction = proto.Float64(float64(s.clipped) / n)
		}
	}
	return m
}

// optimStepMetrics is an optim_step's record: the learning rate applied, and the gradient
// and update norms when the backend reports them (metrics "grad_norm:mean",
// "update_norm:mean").
func optimStepMetrics(adam *loopsv1.AdamParams, res *loopsv1.OptimStepResult, backend time.Duration) *loopsv1.StepMetrics {
	m := &loopsv1.StepMetrics{
		Kind: loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP, Count: 1, BackendSeconds: backend.Seconds(),
		LearningRate: proto.Float64(semantics.AdamWithDefaults(adam).GetLearningRate()),
	}
	if g, ok := res.GetMetrics()["grad_norm:mean"]; ok {
		m.GradNorm = proto.Float64(g)
	}
	if u, ok := res.GetMetrics()["update_norm:mean"]; ok {
		m.UpdateNorm = proto.Float64(u)
	}
	return m
}

// recordStep completes m with the run, seq_id, step and time and queues it for the store.
// Called by the lane before the run's touch and the operation's outcome.
func (c *Core) recordStep(r *run, seq int64, m *loopsv1.StepMetrics) {
	m.TrainingRunId, m.SeqId, m.LastSeqId = r.ID(), seq, seq
	m.Step = r.Record().GetOptimSteps() + 1
	m.LastStep = m.Step
	m.Time = timestamppb.New(c.now())
	c.ops.persist.StepMetrics(r.Workspace(), r.ID(), m)
}

// GetTrainingRunMetrics returns a run's recorded step metrics, oldest first.
func (s TrainingService) GetTrainingRunMetrics(ctx context.Context, req *loopsv1.GetTrainingRunMetricsRequest) (*loopsv1.GetTrainingRunMetricsResponse, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case req.GetFromStep() < 0 || req.GetToStep() < 0:
		return nil, invalidArgument("from_step and to_step must be >= 0 (0: no bound), got %d and %d", req.GetFromStep(), req.GetToStep())
	case req.GetToStep() > 0 && req.GetFromStep() > req.GetToStep():
		return nil, invalidArgument("from_step %d is after to_step %d", req.GetFromStep(), req.GetToStep())
	case req.GetMaxPoints() < 0 || req.GetMaxPoints() > maxMetricsPoints:
		return nil, invalidArgument("max_points must be between 0 (no limit) and %d, got %d", maxMetricsPoints, req.GetMaxPoints())
	}
	id := req.GetTrainingRunId()
	if r, err := c.runOf(ws, id); err == nil {
		id = r.ID()
	} else if _, err := c.store.GetTrainingRun(ctx, ws, id); err != nil {
		return nil, storeErr(err, "training run "+quote(id))
	}
	steps, err := c.store.ListStepMetrics(ctx, ws, id, req.GetFromStep(), req.GetToStep())
	if err != nil {
		return nil, internal("listing run metrics", err)
	}
	return &loopsv1.GetTrainingRunMetricsResponse{Steps: store.DownsampleStepMetrics(steps, int(req.GetMaxPoints()))}, nil
}
