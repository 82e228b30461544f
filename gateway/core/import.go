package core

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/backends/tinkerlayout"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/core/validate"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/bounded"
)

// ImportRequest says what an imported adapter becomes (ImportAdapter).
type ImportRequest struct {
	// Workspace is the importing workspace: the checkpoint is its.
	Workspace string
	// BaseModel is the base model the adapter was trained on (one this server serves, and
	// the workspace's policy allows).
	BaseModel string
	// Name is the checkpoint's name ("imported" when empty).
	Name string
}

// ImportAdapter imports a LoRA adapter folder trained elsewhere: it checks req, has fill
// write the folder's files (adapter_config.json and adapter_model.safetensors, nothing
// else) into an empty staging folder, converts them to PEFT's layout when they are in
// Tinker's (tinkerlayout.ToPEFT: a tinker CLI download, or the cookbook's
// build_lora_adapter output for a tied model), checks them (peft.CheckConfig, then the backend's
// backends.AdapterChecker against the base model and the workspace's max_lora_rank), and
// stores them as the checkpoint weights/<name> of a new run of the workspace (unloaded: its
// reason says it was imported), whose adapter_config.json names the base model. An error
// from fill is returned as it is; a folder that does not pass is InvalidArgument.
func (c *Core) ImportAdapter(ctx context.Context, req ImportRequest, fill func(dir string) error) (*loopsv1.Checkpoint, error) {
	ws, baseModel, name := req.Workspace, req.BaseModel, req.Name
	if ws == "" {
		return nil, invalidArgument("an import needs a workspace")
	}
	if baseModel == "" {
		return nil, invalidArgument("give the base model the adapter was trained on: base_model=<model> (GET /v1/models lists them)")
	}
	bm, err := c.model(baseModel)
	if err != nil {
		return nil, err
	}
	if err := c.policy.AllowModel(ws, baseModel); err != nil {
		return nil, err
	}
	if name == "" {
		name = "imported"
	}
	if err := validate.CheckpointName(name); err != nil {
		return nil, err
	}
	f := c.ckpt
	dir, err := os.MkdirTemp(f.Staging(), "import-")
	if err != nil {
		return nil, f.Internal("creating the import staging folder", err)
	}
	defer os.RemoveAll(dir)
	if err := fill(dir); err != nil {
		return nil, err
	}
	if err := checkImportFiles(dir); err != nil {
		return nil, err
	}
	var pe *fs.PathError
	if _, err := tinkerlayout.ToPEFT(dir, tinkerBase(bm)); errors.As(err, &pe) {
		return nil, internal("converting an imported adapter to PEFT's layout", err) // masked: the path is the server's
	} else if err != nil {
		return nil, invalidArgument("%v", err)
	}
	if err := checkImportedConfig(dir, baseModel); err != nil {
		return nil, err
	}
	checker, ok := c.backend.Sampler().(backends.AdapterChecker)
	if !ok {
		return nil, failedPrecondition("this server's backend cannot validate imported adapters")
	}
	found, err := checker.CheckAdapter(ctx, baseModel, dir)
	if err != nil {
		return nil, err
	}
	lora := &loopsv1.LoraConfig{Rank: int32(found.Rank), TrainAttn: found.Attn, TrainMlp: found.MLP, TrainUnembed: found.Unembed}
	model, err := c.model(baseModel)
	if err != nil {
		return nil, err
	}
	if err := validate.Lora(model, lora); err != nil {
		return nil, err
	}
	if l := c.policy.ModelLimits(ws, baseModel); l.MaxLoraRank > 0 && found.Rank > l.MaxLoraRank {
		return nil, invalidArgument("the adapter's rank %d is over workspace %q's limit of %d (max_lora_rank in its policy, on %s): ask a workspace admin for more: %s",
			found.Rank, ws, l.MaxLoraRank, baseModel, policy.AskCommand(baseModel, "--max-rank "+strconv.Itoa(found.Rank)))
	}
	if err := ckfiles.WriteMarker(dir); err != nil {
		return nil, f.Internal("writing checkpoint marker", err)
	}
	now := c.now()
	run := &loopsv1.TrainingRun{
		Id: newID("run"), BaseModel: baseModel, Lora: lora, CreateTime: timestamppb.New(now), LastRequestTime: timestamppb.New(now),
		UserMetadata: map[string]string{"loops.imported": "true"},
		UnloadReason: "imported adapter: it holds a checkpoint only; create a training run from it (from_checkpoint) to train it",
	}
	kind := loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING
	gen := f.NextGeneration(now, nil)
	key, err := ckfiles.Key(ws, run.Id, kind, name, gen)
	if err != nil {
		return nil, err
	}
	if err := f.Inside(key); err != nil {
		return nil, err
	}
	if err := c.store.PutTrainingRun(ctx, ws, run); err != nil {
		return nil, internal("recording the import's run", err)
	}
	m, err := f.Store().Put(ctx, key, dir)
	if err != nil {
		return nil, f.Internal("storing checkpoint files", err)
	}
	ck := &loopsv1.Checkpoint{
		Id: ckfiles.KindSegment(kind) + "/" + name, TrainingRunId: run.Id, Kind: kind, Name: name,
		TinkerPath: checkpointPath(run.Id, kind, name), SizeBytes: m.Size(),
		CreateTime: timestamppb.New(time.Unix(0, gen)), BaseModel: baseModel, Lora: lora,
	}
	if _, err := c.commitCheckpoint(ctx, ws, ck); err != nil {
		if derr := f.Store().Delete(context.WithoutCancel(ctx), key); derr != nil {
			c.log.Error("deleting an unrecorded import; the store sweep retries", slog.String("key", key), slog.Any("err", derr))
		}
		return nil, err
	}
	run.LastCheckpoint = ck
	if err := c.store.PutTrainingRun(ctx, ws, run); err != nil {
		c.log.Error("recording an import's checkpoint on its run", slog.Any("err", err))
	}
	c.recordUsage(ws, baseModel, "", store.UsageCheckpoint, 1)
	c.log.Info("adapter imported", slog.String("workspace", ws), slog.String("path", ck.GetTinkerPath()), slog.Int("rank", found.Rank))
	return ck, nil
}

// importFiles are the files of an imported adapter folder.
var importFiles = []string{peft.AdapterConfigFile, peft.AdapterWeightsFile}

// mergedFiles are files of a merged model folder (loops checkpoints export --format merged,
// the cookbook's build_hf_model), which is not an adapter.
var mergedFiles = []string{"config.json", "model.safetensors", "model.safetensors.index.json"}

// MergedModelFile answers InvalidArgument, saying what to send instead, when an import
// holds the file name of a merged model folder (config.json, model.safetensors): a merged
// model is not an adapter. It answers nil for any other name.
func MergedModelFile(name string) error {
	if !slices.Contains(mergedFiles, name) {
		return nil
	}
	return invalidArgument("the import holds %s, a file of a merged model folder: a merged model is not an adapter and cannot be imported; send the adapter folder (%s and %s) in PEFT's layout (loops checkpoints export --format peft, or build_lora_adapter's output) or Tinker's (tinker checkpoint download)", name, peft.AdapterConfigFile, peft.AdapterWeightsFile)
}

// checkImportFiles checks that an import's staging folder holds the two files of an
// adapter folder, as regular files, and nothing else.
func checkImportFiles(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return internal("reading the import staging folder", err)
	}
	seen := map[string]bool{}
	for _, e := range es {
		if err := MergedModelFile(e.Name()); err != nil {
			return err
		}
		if !slices.Contains(importFiles, e.Name()) || !e.Type().IsRegular() {
			return invalidArgument("the import holds %q: send only %s and %s", clip(e.Name()), peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
		seen[e.Name()] = true
	}
	for _, f := range importFiles {
		if !seen[f] {
			return invalidArgument("the import has no %s: send a PEFT adapter folder (%s and %s)", f, peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
	}
	return nil
}

// checkImportedConfig checks an imported adapter's adapter_config.json
// (peft.CheckConfig) and records the base model in it (base_model_name_or_path), which a
// backend loading the checkpoint reads; the other fields stay as they were.
func checkImportedConfig(dir, baseModel string) error {
	p := filepath.Join(dir, peft.AdapterConfigFile)
	b, err := bounded.ReadFile(p, peft.MaxConfigBytes)
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return internal("reading the imported "+peft.AdapterConfigFile, err) // masked: the path is the server's
	case err != nil:
		return invalidArgument("%v", err) // over the size limit
	}
	if err := peft.CheckConfig(b); err != nil {
		return invalidArgument("%v", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return invalidArgument("%s is not a JSON object: %v", peft.AdapterConfigFile, err)
	}
	cfg["base_model_name_or_path"], _ = json.Marshal(baseModel)
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return internal("writing adapter config", err)
	}
	if err := os.WriteFile(p, out, 0o644); err != nil {
		return internal("writing adapter config", err)
	}
	return nil
}
