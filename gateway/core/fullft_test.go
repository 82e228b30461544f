package core

import (
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/replicaplan"
)

// fullModel is fake/model as a backend that serves full fine-tuning reports it, with
// Qwen3-8B's planning fields in bfloat16 (internal/replicaplan's arithmetic: a
// full fine-tuning run of rank-16 LoRA neighbours and 64-token sequences needs 2 devices of
// 80 GiB).
func fullModel() *loopsv1.ModelInfo {
	return &loopsv1.ModelInfo{Name: "fake/model", MaxSequenceLength: 64, VocabSize: 151936, HiddenSize: 4096, MaxLoraRank: 16,
		TokenizerId: "/tmp/tok", FullFinetune: true, ParameterCount: 8190735360, WeightDtype: "bfloat16", NumLayers: 36,
		IntermediateSize: 12288, NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, LoraParametersPerRank: 2883968,
		LogitsChunkElements: 1 << 28}
}

func fullRun(h *harness) error {
	_, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 0, TrainAttn: true, TrainMlp: true, TrainUnembed: true}})
	return err
}

// TestFullFinetuneRefusals: a run of LoRA rank 0 is refused before any work where the
// workspace policy does not allow full fine-tuning (the default), and where a replica cannot
// hold it, with the arithmetic; a replica that holds it creates the run.
func TestFullFinetuneRefusals(t *testing.T) {
	open := func(t *testing.T, pol string, devices int64) *harness {
		p, err := policy.Parse([]byte(pol))
		require.NoError(t, err)
		fake := newFakeBackend()
		fake.info = fullModel()
		h, _ := openHarnessWith(t, t.TempDir(), fake, fake, Options{Policy: p,
			Replica: replicaplan.Config{DeviceMemory: 80 << 30, Devices: devices}})
		return h
	}
	h := open(t, "default: {}\n", 4)
	err := fullRun(h)
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Contains(t, errs.Message(err), "loops access request --model fake/model --full-finetune")

	h = open(t, "default: {allow_full_finetune: true}\n", 1)
	err = fullRun(h)
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Contains(t, errs.Message(err), "full fine-tuning (rank 0) of fake/model does not fit a replica of 1 device(s) of 80.00 GiB")
	require.Contains(t, errs.Message(err), "8190735360 parameters × 18 B = 137.31 GiB")
	require.Contains(t, errs.Message(err), "each device needs 155.29 GiB, over its 80.00 GiB; a replica of 2 such devices would hold it")
	h.newRun() // LoRA runs are not concerned

	h = open(t, "default: {allow_full_finetune: true}\n", 4)
	require.NoError(t, fullRun(h))
	ws, err := h.svc.Workspace.GetWorkspace(h.ctx, &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	require.True(t, ws.GetLimits().GetAllowFullFinetune())
}
