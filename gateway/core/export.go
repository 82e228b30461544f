package core

import (
	"context"
	"net/url"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// ExportPath is where checkpoint exports are served (gateway/ckhttp): GET
// ExportPath?path=<tinker path>&format=peft|merged, with the API key, answers a tar stream
// of the exported folder.
const ExportPath = "/v1/checkpoint_exports"

// exportFormats are the formats' names in ExportPath's query.
var exportFormats = map[loopsv1.ExportFormat]string{
	loopsv1.ExportFormat_EXPORT_FORMAT_PEFT:   "peft",
	loopsv1.ExportFormat_EXPORT_FORMAT_MERGED: "merged",
}

// GetCheckpointExportURL checks that the caller may read the checkpoint and returns the
// URL of its export (on this server, to be fetched with the API key).
func (s CheckpointService) GetCheckpointExportURL(ctx context.Context, req *loopsv1.GetCheckpointExportURLRequest) (*loopsv1.GetCheckpointExportURLResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	name, ok := exportFormats[req.GetFormat()]
	if !ok {
		return nil, invalidArgument("format must be EXPORT_FORMAT_PEFT or EXPORT_FORMAT_MERGED, got %v", req.GetFormat())
	}
	if _, _, err := s.c.resolveOwned(ctx, ws, req.GetPath()); err != nil {
		return nil, err
	}
	q := url.Values{"path": {req.GetPath()}, "format": {name}}
	return &loopsv1.GetCheckpointExportURLResponse{Url: ExportPath + "?" + q.Encode()}, nil
}

// CheckpointFolder is a local folder holding one checkpoint generation's files
// (OpenCheckpointFolder), kept until Release is called.
type CheckpointFolder struct {
	// Checkpoint is the checkpoint's record.
	Checkpoint *loopsv1.Checkpoint
	// Dir holds its files (adapter_config.json, adapter_model.safetensors, and more for a
	// training checkpoint); read it only.
	Dir string
	// Release lets the folder go (a cached copy of a remote store's files may then be
	// evicted). Call it once.
	Release func()
}

// OpenCheckpointFolder finds the checkpoint at path that workspace ws may read (its own,
// or a public one: NotFound otherwise) and opens a local folder with its current
// generation's files.
func (c *Core) OpenCheckpointFolder(ctx context.Context, ws, path string) (CheckpointFolder, error) {
	ck, ref, err := c.resolveCheckpoint(ctx, ws, path)
	if err != nil {
		return CheckpointFolder{}, err
	}
	return CheckpointFolder{Checkpoint: ck, Dir: ref.Dir(), Release: ref.Release}, nil
}

// MergeAdapter writes into outDir the base model of ck with the adapter folder adapterDir
// merged into its weights (a Hugging Face model folder), through the backend's
// backends.Merger ability, and returns the bytes written. It fails with FailedPrecondition
// when the backend cannot merge, and with the backend's error (ResourceExhausted over
// maxBytes, InvalidArgument, ...) otherwise; an error without a code is Internal.
func (c *Core) MergeAdapter(ctx context.Context, ck *loopsv1.Checkpoint, adapterDir, outDir string, maxBytes int64) (int64, error) {
	merger, ok := c.backend.Sampler().(backends.Merger)
	if !ok {
		return 0, failedPrecondition("this server's backend cannot merge adapters: export with --format peft")
	}
	n, err := merger.MergeAdapter(ctx, backends.MergeRequest{BaseModel: ck.GetBaseModel(), AdapterDir: adapterDir, OutDir: outDir, MaxBytes: maxBytes})
	if err != nil && connect.CodeOf(err) == connect.CodeUnknown {
		err = internal("merging the adapter", err)
	}
	return n, err
}
