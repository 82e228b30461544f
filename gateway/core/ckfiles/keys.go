package ckfiles

import (
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/core/apierr"
	"github.com/loops-dev/loops/gateway/core/validate"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The key segments of the checkpoint kinds, and of step snapshots.
const (
	segmentTraining = "weights"
	segmentSampler  = "sampler_weights"
	segmentExternal = "external_weights"
	// segmentRecovery holds step snapshots: <ws>/<run>/recovery/step-<seq>@<gen>.
	segmentRecovery = "recovery"
)

// KindSegment is a checkpoint kind as checkpoint paths and keys spell it: weights,
// sampler_weights or external_weights.
func KindSegment(k loopsv1.CheckpointKind) string {
	switch k {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		return segmentSampler
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL:
		return segmentExternal
	}
	return segmentTraining
}

// KindOf is the checkpoint kind a path or key segment names (KindSegment's inverse); ok is
// false for any other segment.
func KindOf(segment string) (kind loopsv1.CheckpointKind, ok bool) {
	switch segment {
	case segmentTraining:
		return loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, true
	case segmentSampler:
		return loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, true
	case segmentExternal:
		return loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL, true
	}
	return 0, false
}

// Generation is a checkpoint's generation: its create_time in Unix nanoseconds.
func Generation(ck *loopsv1.Checkpoint) int64 { return ck.GetCreateTime().AsTime().UnixNano() }

func genEntry(name string, gen int64) string { return name + "@" + strconv.FormatInt(gen, 10) }

// runPrefix is the key prefix of a run's checkpoints; it refuses workspace and run ids that
// are not plain names.
func runPrefix(ws, runID string) (string, error) {
	for _, e := range []string{ws, runID} {
		if e == "" || e == "." || e == ".." || strings.ContainsAny(e, `/\@`) || strings.ContainsRune(e, 0) {
			return "", connect.NewError(connect.CodeInternal, fmt.Errorf("checkpoint key element %q is not a plain name; refused", e))
		}
	}
	return ws + "/" + runID, nil
}

// Key is the store key of one generation of a checkpoint. It refuses (Internal) workspace
// and run ids that are not plain names, and keys the store would refuse.
func Key(ws, runID string, kind loopsv1.CheckpointKind, name string, gen int64) (string, error) {
	p, err := runPrefix(ws, runID)
	if err != nil {
		return "", err
	}
	k := p + "/" + KindSegment(kind) + "/" + genEntry(name, gen)
	if err := ckstore.ValidKey(k); err != nil {
		return "", apierr.Internal("checkpoint key", err)
	}
	return k, nil
}

// RecordKey is the store key of the generation a record of workspace ws points at. A record
// whose name is not a valid checkpoint name has none (Internal).
func RecordKey(ws string, ck *loopsv1.Checkpoint) (string, error) {
	if err := validate.CheckpointName(ck.GetName()); err != nil {
		return "", apierr.Internal("checkpoint record "+ck.GetTinkerPath()+" has a bad name", err)
	}
	return Key(ws, ck.GetTrainingRunId(), ck.GetKind(), ck.GetName(), Generation(ck))
}

// ParseKey splits a checkpoint key written by Key into its parts; ok is false for any other
// key (a snapshot's, another program's).
func ParseKey(key string) (ws, runID string, kind loopsv1.CheckpointKind, name string, gen int64, ok bool) {
	parts := strings.Split(key, "/")
	if len(parts) != 4 {
		return "", "", 0, "", 0, false
	}
	kind, ok = KindOf(parts[2])
	if !ok {
		return "", "", 0, "", 0, false
	}
	name, g, found := strings.Cut(parts[3], "@")
	gen, err := strconv.ParseInt(g, 10, 64)
	if !found || err != nil || strconv.FormatInt(gen, 10) != g { // only the spelling genEntry writes
		return "", "", 0, "", 0, false
	}
	return parts[0], parts[1], kind, name, gen, true
}

// SnapshotKey is the store key of a snapshot of a run's adapter and Adam state after the
// call at seq, taken at generation gen (Unix nanoseconds).
func SnapshotKey(ws, runID string, seq, gen int64) (string, error) {
	p, err := runPrefix(ws, runID)
	if err != nil {
		return "", err
	}
	k := p + "/" + segmentRecovery + "/" + genEntry("step-"+strconv.FormatInt(seq, 10), gen)
	if err := ckstore.ValidKey(k); err != nil {
		return "", apierr.Internal("snapshot key", err)
	}
	return k, nil
}

// IsSnapshotKey reports whether key names a step snapshot (written by SnapshotKey), and its
// generation.
func IsSnapshotKey(key string) (gen int64, ok bool) {
	parts := strings.Split(key, "/")
	if len(parts) != 4 || parts[2] != segmentRecovery {
		return 0, false
	}
	name, g, found := strings.Cut(parts[3], "@")
	if !found || !strings.HasPrefix(name, "step-") {
		return 0, false
	}
	gen, err := strconv.ParseInt(g, 10, 64)
	if err != nil || strconv.FormatInt(gen, 10) != g {
		return 0, false
	}
	return gen, true
}

// segmentReceipt holds a run's recorded batches (docs/receipts.md):
// <ws>/<run>/receipt/batch-<seq>. The sweep leaves them (no record references them; they
// go with the run).
const segmentReceipt = "receipt"

// ReceiptBatchFile is the one file of a recorded batch's key.
const ReceiptBatchFile = "batch.pb"

// ReceiptBatchKey is the store key of the batch a run recording data kept for its
// forward_backward at seq.
func ReceiptBatchKey(ws, runID string, seq int64) (string, error) {
	p, err := runPrefix(ws, runID)
	if err != nil {
		return "", err
	}
	k := p + "/" + segmentReceipt + "/batch-" + strconv.FormatInt(seq, 10)
	if err := ckstore.ValidKey(k); err != nil {
		return "", apierr.Internal("receipt batch key", err)
	}
	return k, nil
}
