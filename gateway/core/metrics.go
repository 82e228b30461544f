package core

import (
	"sync/atomic"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	opsCreated  *prometheus.CounterVec
	opsFinished *prometheus.CounterVec
	opDuration  *prometheus.HistogramVec
	waiters     prometheus.Gauge
	batchItems  prometheus.Histogram
	tokens      *prometheus.CounterVec
	slotMoves   *prometheus.CounterVec
	// step recovery (recovery.go)
	recovery        *prometheus.CounterVec
	replayedCalls   prometheus.Counter
	snapshotSeconds prometheus.Histogram
	rebuildSeconds  prometheus.Histogram
	// dedicated runs (dedicated.go)
	poolBinds *prometheus.HistogramVec
	// sampling (sampling.go): time to first token by source, tokens sampled through
	// deployments, and the samples on the backend at once.
	firstToken       *prometheus.HistogramVec
	deploymentTokens *prometheus.CounterVec
	sampleBatch      prometheus.Histogram
	samplesRunning   atomic.Int64
}

// Sources of a sample (the source label of loops_sample_time_to_first_token_seconds): a
// deployment's (the OpenAI and Anthropic routes, loops.v1 with a deployment model path),
// or a sampler's (a Tinker sampling client, a loops.v1 sampler).
const (
	sourceDeployment = "deployment"
	sourceSampler    = "sampler"
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		opsCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_operations_created_total", Help: "Operations created, by kind.",
		}, []string{"kind"}),
		opsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_operations_finished_total", Help: "Operations finished, by kind and final state.",
		}, []string{"kind", "state"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loops_operation_duration_seconds", Help: "Time from submission to completion, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"kind"}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loops_operation_waiters", Help: "Requests currently long-polling an operation.",
		}),
		batchItems: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loops_backend_batch_items", Help: "Runs per backend forward/backward call.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_tokens_total", Help: "Tokens processed, by kind (train, sample_prompt, sample_prompt_cached: the prompt tokens served from a prefix cache, sample_output).",
		}, []string{"kind"}),
		slotMoves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_adapter_slot_moves_total", Help: "Adapters moved out of (offload) and back into (restore) the backend's slots.",
		}, []string{"direction"}),
		recovery: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_step_recovery_events_total", Help: "Step recovery events: snapshot, snapshot_failed, rebuilt, rebuild_failed, log_dropped.",
		}, []string{"event"}),
		replayedCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loops_step_recovery_replayed_calls_total", Help: "Backend calls replayed to rebuild lost adapters.",
		}),
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loops_step_snapshot_seconds", Help: "Time to store a run's step snapshot (off the run's critical path).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}),
		rebuildSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loops_step_rebuild_seconds", Help: "Time to rebuild a lost adapter: waiting for a replica, loading the snapshot, replaying.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}),
		poolBinds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loops_dedicated_pool_bind_seconds", Help: "Time to bind a dedicated pool to a run, by start (cold: started; warm: a released pool reused).",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 14),
		}, []string{"start"}),
		firstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loops_sample_time_to_first_token_seconds", Help: "Time from a streamed sample's submission (its queue wait included) to its first token, by source (deployment or sampler).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"source"}),
		deploymentTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_deployment_tokens_total", Help: "Tokens of the samples of deployments, by kind (prompt, output).",
		}, []string{"kind"}),
		sampleBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loops_sample_batch_size", Help: "Samples on the backend at once (the decoding batch a sample joins, itself included), observed when each sample starts.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
	}
	if reg != nil {
		reg.MustRegister(m.opsCreated, m.opsFinished, m.opDuration, m.waiters, m.batchItems, m.tokens, m.slotMoves,
			m.recovery, m.replayedCalls, m.snapshotSeconds, m.rebuildSeconds, m.poolBinds,
			m.firstToken, m.deploymentTokens, m.sampleBatch,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "loops_samples_running", Help: "Samples on the backend now.",
			}, func() float64 { return float64(m.samplesRunning.Load()) }))
	}
	return m
}

func kindLabel(k loopsv1.OperationKind) string {
	switch k {
	case loopsv1.OperationKind_OPERATION_KIND_CREATE_TRAINING_RUN:
		return "create_training_run"
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD:
		return "forward"
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD:
		return "forward_backward"
	case loopsv1.OperationKind_OPERATION_KIND_OPTIM_STEP:
		return "optim_step"
	case loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS:
		return "save_weights"
	case loopsv1.OperationKind_OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER:
		return "save_weights_for_sampler"
	case loopsv1.OperationKind_OPERATION_KIND_LOAD_WEIGHTS:
		return "load_weights"
	case loopsv1.OperationKind_OPERATION_KIND_SAMPLE:
		return "sample"
	case loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN:
		return "unload"
	}
	return "unknown"
}

func stateLabel(s loopsv1.OperationState) string {
	switch s {
	case loopsv1.OperationState_OPERATION_STATE_SUCCEEDED:
		return "succeeded"
	case loopsv1.OperationState_OPERATION_STATE_CANCELLED:
		return "cancelled"
	}
	return "failed"
}
