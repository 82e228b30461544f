package core

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// GetCheckpointExportURL returns a short-lived URL for a checkpoint exported in a format.
func (s CheckpointService) GetCheckpointExportURL(ctx context.Context, req *loopsv1.GetCheckpointExportURLRequest) (*loopsv1.GetCheckpointExportURLResponse, error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("checkpoint export is not implemented yet"))
}
