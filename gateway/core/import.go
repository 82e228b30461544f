package core

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/peft"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/bounded"
	"google.golang.org/protobuf/encoding/protojson"
)

// ImportPath is where adapters trained elsewhere are imported: POST
// ImportPath?base_model=<model>[&name=<name>], with the API key, and a tar of a PEFT
// adapter folder (adapter_config.json, adapter_model.safetensors) as the body. The answer
// is the new checkpoint (loops.v1 Checkpoint as JSON): tinker://<run>/weights/<name> of a
// run made for it, which samplers, deployments and new training runs (from_checkpoint,
// load_state) take like any other.
const ImportPath = "/v1/checkpoint_imports"

// Import bounds: the body is read only up to MaxImportBytes, each file within its own cap,
// and at most MaxConcurrentImports run at once (429 past it).
const (
	// MaxImportBytes caps an import's body (the tar).
	MaxImportBytes = 4 << 30
	// MaxConcurrentImports is how many imports run at once on this server.
	MaxConcurrentImports = 2
	// ImportTimeout bounds an import from the first byte of its body to its answer.
	ImportTimeout = 30 * time.Minute
)

var importSlots = make(chan struct{}, MaxConcurrentImports)

// importFiles are the files an import takes, with their caps.
var importFiles = map[string]int64{
	peft.AdapterConfigFile:  peft.MaxConfigBytes,
	peft.AdapterWeightsFile: MaxImportBytes,
}

// ImportHandler serves ImportPath.
func (c *Core) ImportHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := auth.RequireWorkspace(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		select {
		case importSlots <- struct{}{}:
			defer func() { <-importSlots }()
		default:
			writeErr(w, c.limitReached("LIMIT_REACHED", "max_concurrent_imports", "%d imports are running, the most this server runs at once: retry later", MaxConcurrentImports))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), ImportTimeout)
		defer cancel()
		ck, err := c.importAdapter(ctx, ws, r.URL.Query().Get("base_model"), r.URL.Query().Get("name"), http.MaxBytesReader(w, r.Body, MaxImportBytes))
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				writeDetail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the import is over %d bytes", int64(MaxImportBytes)))
				return
			}
			writeErr(w, err)
			return
		}
		b, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ck)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
}

// importAdapter reads a tar of an adapter folder from body, checks it against the base
// model, and stores it as the checkpoint weights/<name> of a new run (unloaded: its reason
// says it was imported) of the workspace.
func (c *Core) importAdapter(ctx context.Context, ws, baseModel, name string, body io.Reader) (*loopsv1.Checkpoint, error) {
	if baseModel == "" {
		return nil, invalidArgument("give the base model the adapter was trained on: base_model=<model> (GET /v1/models lists them)")
	}
	if _, err := c.model(baseModel); err != nil {
		return nil, err
	}
	if err := c.policy.AllowModel(ws, baseModel); err != nil {
		return nil, err
	}
	if name == "" {
		name = "imported"
	}
	if err := validateCheckpointName(name); err != nil {
		return nil, err
	}
	f := c.ckpt
	dir, err := os.MkdirTemp(f.staging, "import-")
	if err != nil {
		return nil, f.internalFS("creating the import staging folder", err)
	}
	defer os.RemoveAll(dir)
	if err := untarAdapter(body, dir); err != nil {
		return nil, err
	}
	if err := setAdapterBase(dir, baseModel); err != nil {
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
	if err := validateLora(model, lora); err != nil {
		return nil, err
	}
	if l := c.policy.Limits(ws); l.MaxLoraRank > 0 && found.Rank > l.MaxLoraRank {
		return nil, invalidArgument("the adapter's rank %d is over workspace %q's limit of %d (max_lora_rank in its policy)", found.Rank, ws, l.MaxLoraRank)
	}
	if err := writeMarker(dir); err != nil {
		return nil, f.internalFS("writing checkpoint marker", err)
	}
	now := c.now()
	run := &loopsv1.TrainingRun{
		Id: newID("run"), BaseModel: baseModel, Lora: lora, CreateTime: timestamppb.New(now), LastRequestTime: timestamppb.New(now),
		UserMetadata: map[string]string{"loops.imported": "true"},
		UnloadReason: "imported adapter: it holds a checkpoint only; create a training run from it (from_checkpoint) to train it",
	}
	kind := loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING
	gen := f.nextGeneration(now, nil)
	key, err := f.key(ws, run.Id, kind, name, gen)
	if err != nil {
		return nil, err
	}
	if err := f.inside(key); err != nil {
		return nil, err
	}
	if err := c.store.PutTrainingRun(ctx, ws, run); err != nil {
		return nil, internal("recording the import's run", err)
	}
	m, err := f.st.Put(ctx, key, dir)
	if err != nil {
		return nil, f.internalFS("storing checkpoint files", err)
	}
	ck := &loopsv1.Checkpoint{
		Id: kindSegment(kind) + "/" + name, TrainingRunId: run.Id, Kind: kind, Name: name,
		TinkerPath: checkpointPath(run.Id, kind, name), SizeBytes: m.Size(),
		CreateTime: timestamppb.New(time.Unix(0, gen)), BaseModel: baseModel, Lora: lora,
	}
	if _, err := c.commitCheckpoint(ctx, ws, ck); err != nil {
		if derr := f.st.Delete(context.WithoutCancel(ctx), key); derr != nil {
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

// untarAdapter writes the adapter files of a tar stream into dir: adapter_config.json and
// adapter_model.safetensors, each within its cap; any other entry is refused, and both are
// required.
func untarAdapter(body io.Reader, dir string) error {
	tr := tar.NewReader(body)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				return err
			}
			return invalidArgument("the body is not a tar archive of an adapter folder: %v", err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		base := filepath.Base(h.Name)
		limit, ok := importFiles[base]
		if !ok || h.Typeflag != tar.TypeReg {
			return invalidArgument("the import holds %q: send only %s and %s", clip(h.Name), peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
		if seen[base] {
			return invalidArgument("the import holds %s twice", base)
		}
		seen[base] = true
		if h.Size > limit {
			return invalidArgument("%s is %d bytes, over the %d-byte limit", base, h.Size, limit)
		}
		out, err := os.Create(filepath.Join(dir, base))
		if err != nil {
			return internal("writing the import", err)
		}
		_, err = io.Copy(out, io.LimitReader(tr, limit))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				return err
			}
			return invalidArgument("reading %s from the import: %v", base, err)
		}
	}
	for f := range importFiles {
		if !seen[f] {
			return invalidArgument("the import has no %s: send a PEFT adapter folder (%s and %s)", f, peft.AdapterConfigFile, peft.AdapterWeightsFile)
		}
	}
	return nil
}

// setAdapterBase records the base model in the adapter's adapter_config.json
// (base_model_name_or_path), which a backend loading the checkpoint reads; the other fields
// stay as they were.
func setAdapterBase(dir, baseModel string) error {
	p := filepath.Join(dir, peft.AdapterConfigFile)
	b, err := bounded.ReadFile(p, peft.MaxConfigBytes)
	if err != nil {
		return invalidArgument("%s: %v", peft.AdapterConfigFile, err)
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
