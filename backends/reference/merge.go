package reference

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
)

var _ backends.Merger = (*Engine)(nil)

// mergedWeightsFile is the merged model's one safetensors file.
const mergedWeightsFile = "model.safetensors"

// copiedFiles are the base model's files a merged folder carries over unchanged (those
// present): its tokenizer, chat template and generation settings.
var copiedFiles = []string{
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
	"vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json",
}

// maxCopiedFileBytes caps each carried-over file.
const maxCopiedFileBytes = 64 << 20

// MergeAdapter writes the base model with the adapter folded in (backends.Merger).
func (e *Engine) MergeAdapter(ctx context.Context, req backends.MergeRequest) (int64, error) {
	bm, err := e.model(req.BaseModel)
	if err != nil {
		return 0, err
	}
	a, err := nn.LoadAdapter[float32](req.AdapterDir, bm.m, false, e.opts.MaxLoraRank)
	if err != nil {
		return 0, invalid("the adapter does not fit base model %s: %v", req.BaseModel, err)
	}
	size := nn.MergedBytes(bm.m, a)
	if req.MaxBytes > 0 && size > req.MaxBytes {
		return 0, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the merged model would be %d bytes, over this server's export limit of %d: export --format peft and merge elsewhere", size, req.MaxBytes))
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	merged := nn.Merged(bm.m, a)
	n, err := safetensors.Write(filepath.Join(req.OutDir, mergedWeightsFile), merged.Tensors(), map[string]string{"format": "pt"})
	if err != nil {
		return 0, fmt.Errorf("writing merged weights: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c, err := mergedConfig(bm.dir, !merged.Cfg.Tied)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(req.OutDir, "config.json"), c, 0o644); err != nil {
		return 0, err
	}
	n += int64(len(c))
	for _, f := range copiedFiles {
		k, err := copyFile(filepath.Join(bm.dir, f), filepath.Join(req.OutDir, f))
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// mergedConfig is the base model's config.json for float32 weights, with
// tie_word_embeddings false when the head is a weight of its own.
func mergedConfig(dir string, untied bool) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	cfg["torch_dtype"] = "float32"
	if _, ok := cfg["dtype"]; ok {
		cfg["dtype"] = "float32"
	}
	if untied {
		cfg["tie_word_embeddings"] = false
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// copyFile copies a regular file of at most maxCopiedFileBytes; a missing one is skipped.
func copyFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return 0, err
	}
	if st.Size() > maxCopiedFileBytes {
		return 0, fmt.Errorf("%s is over %d bytes", filepath.Base(src), maxCopiedFileBytes)
	}
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, io.LimitReader(in, maxCopiedFileBytes))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

var _ backends.AdapterChecker = (*Engine)(nil)

// CheckAdapter validates an adapter folder against a served base model
// (backends.AdapterChecker) with the checks of a load.
func (e *Engine) CheckAdapter(_ context.Context, baseModel, dir string) (backends.AdapterCheck, error) {
	bm, err := e.model(baseModel)
	if err != nil {
		return backends.AdapterCheck{}, err
	}
	a, err := nn.LoadAdapter[float32](dir, bm.m, false, e.opts.MaxLoraRank)
	if err != nil {
		return backends.AdapterCheck{}, invalid("the adapter does not fit base model %s: %v", baseModel, err)
	}
	return backends.AdapterCheck{
		Rank: a.Cfg.Rank, Alpha: float64(a.Scale) * float64(a.Cfg.Rank),
		Attn: a.Cfg.Attn, MLP: a.Cfg.MLP, Unembed: a.Cfg.Unembed,
	}, nil
}
