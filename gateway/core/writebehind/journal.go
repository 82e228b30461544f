package writebehind

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
)

// The journal's format. A journal file is a sequence of frames: a little-endian uint32 payload length, the
// payload's CRC-32C, the payload. A payload is a record kind byte, the workspace (a uvarint
// length and its bytes) and the record's protobuf encoding. A torn last frame (the OS died
// in the middle of a write) ends the file's replay.

// JournalDir is the journal's directory under the data directory given to Recover.
const JournalDir = "journal"

const (
	journalRun     byte = 1
	journalOp      byte = 2
	journalMetrics byte = 3 // a loops.v1.StepMetrics (its training_run_id names the run)
	journalReceipt byte = 4 // a loops.v1.ReceiptStep (its training_run_id names the run)
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// maxJournalFrame bounds one frame's payload when replaying (a corrupt length).
const maxJournalFrame = 64 << 20

// journal is the persister's append-only file. Only the persister's goroutine appends;
// rotation happens under the persister's journal lock.
type journal struct {
	dir  string
	f    *os.File
	name string
	last int64 // the last file number used (file names sort in creation order)
	size int64 // bytes in the current file
	buf  []byte
}

// openJournal creates the directory and a fresh file to append to.
func openJournal(dataDir string) (*journal, error) {
	j := &journal{dir: filepath.Join(dataDir, JournalDir)}
	if err := os.MkdirAll(j.dir, 0o750); err != nil {
		return nil, fmt.Errorf("writebehind: journal: %w", err)
	}
	if _, err := j.rotate(); err != nil {
		return nil, err
	}
	return j, nil
}

// rotate starts a new file and returns the name of the previous one ("" for none), whose
// records the caller then owns.
func (j *journal) rotate() (string, error) {
	n := max(time.Now().UnixNano(), j.last+1)
	name := filepath.Join(j.dir, fmt.Sprintf("%020d.log", n))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return "", fmt.Errorf("writebehind: journal: %w", err)
	}
	old, oldName := j.f, j.name
	j.f, j.name, j.last, j.size = f, name, n, 0
	if old != nil {
		_ = old.Close()
	}
	return oldName, nil
}

// append writes every record of b in one write.
func (j *journal) append(b store.Batch) error {
	buf := j.buf[:0]
	for _, r := range b.TrainingRuns {
		var err error
		if buf, err = appendFrame(buf, journalRun, r.Workspace, r.Run); err != nil {
			return err
		}
	}
	for _, o := range b.Operations {
		var err error
		if buf, err = appendFrame(buf, journalOp, o.Workspace, o.Operation); err != nil {
			return err
		}
	}
	for _, m := range b.StepMetrics {
		var err error
		if buf, err = appendFrame(buf, journalMetrics, m.Workspace, m.Metrics); err != nil {
			return err
		}
	}
	for _, m := range b.ReceiptSteps {
		var err error
		if buf, err = appendFrame(buf, journalReceipt, m.Workspace, m.Step); err != nil {
			return err
		}
	}
	if cap(buf) <= 1<<20 {
		j.buf = buf
	}
	n, err := j.f.Write(buf)
	j.size += int64(n)
	if err != nil {
		return fmt.Errorf("writebehind: journal: %w", err)
	}
	return nil
}

// close closes the file being appended to and, with remove (the caller has committed
// everything in it), removes it.
func (j *journal) close(remove bool) {
	_ = j.f.Close()
	if remove {
		_ = os.Remove(j.name)
	}
}

func appendFrame(buf []byte, kind byte, ws string, m proto.Message) ([]byte, error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0, kind)
	buf = binary.AppendUvarint(buf, uint64(len(ws)))
	buf = append(buf, ws...)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, m)
	if err != nil {
		return buf[:start], fmt.Errorf("writebehind: journal: encode: %w", err)
	}
	payload := buf[start+8:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(payload, crc32c))
	return buf, nil
}

// JournalFiles lists the journal files in dataDir (under JournalDir), oldest first: those
// that a process being started would replay, or that the running one appends to.
func JournalFiles(dataDir string) ([]string, error) {
	return journalFiles(filepath.Join(dataDir, JournalDir))
}

// journalFiles lists the journal's files in dir, oldest first.
func journalFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".log") {
			names = append(names, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(names)
	return names, nil
}

// readJournalFile adds the records of one file to b's maps (later records win) and its
// step metrics and receipt steps to *appended (when appended is not nil), and reports
// whether the file ended cleanly.
func readJournalFile(name string, runs map[string]store.OwnedTrainingRun, ops map[string]store.OwnedOperation, appended *store.Batch) (clean bool, err error) {
	f, err := os.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return errors.Is(err, io.EOF), nil
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n == 0 || n > maxJournalFrame {
			return false, nil
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return false, nil
		}
		if crc32.Checksum(payload, crc32c) != binary.LittleEndian.Uint32(hdr[4:]) {
			return false, nil
		}
		kind := payload[0]
		wsLen, k := binary.Uvarint(payload[1:])
		if k <= 0 || uint64(len(payload)-1-k) < wsLen {
			return false, nil
		}
		ws := string(payload[1+k : 1+k+int(wsLen)])
		data := payload[1+k+int(wsLen):]
		switch kind {
		case journalRun:
			m := &loopsv1.TrainingRun{}
			if err := proto.Unmarshal(data, m); err != nil {
				return false, nil
			}
			runs[m.GetId()] = store.OwnedTrainingRun{Workspace: ws, Run: m}
		case journalOp:
			m := &loopsv1.Operation{}
			if err := proto.Unmarshal(data, m); err != nil {
				return false, nil
			}
			ops[m.GetId()] = store.OwnedOperation{Workspace: ws, Operation: m}
		case journalMetrics:
			m := &loopsv1.StepMetrics{}
			if err := proto.Unmarshal(data, m); err != nil {
				return false, nil
			}
			if appended != nil {
				appended.StepMetrics = append(appended.StepMetrics, store.OwnedStepMetrics{Workspace: ws, RunID: m.GetTrainingRunId(), Metrics: m})
			}
		case journalReceipt:
			m := &loopsv1.ReceiptStep{}
			if err := proto.Unmarshal(data, m); err != nil {
				return false, nil
			}
			if appended != nil {
				appended.ReceiptSteps = append(appended.ReceiptSteps, store.OwnedReceiptStep{Workspace: ws, Step: m})
			}
		default:
			return false, nil
		}
	}
}

// replayJournal commits the records that journal files left by an earlier process hold
// to the store (later records win) and removes the files. It runs at start-up, before
// unfinished operations are failed and runs recovered.
func replayJournal(ctx context.Context, dataDir string, st Writer, log *slog.Logger) error {
	dir := filepath.Join(dataDir, JournalDir)
	names, err := journalFiles(dir)
	if err != nil {
		return fmt.Errorf("writebehind: journal: %w", err)
	}
	if len(names) == 0 {
		return nil
	}
	runs, ops := map[string]store.OwnedTrainingRun{}, map[string]store.OwnedOperation{}
	var b store.Batch
	for _, name := range names {
		clean, err := readJournalFile(name, runs, ops, &b)
		if err != nil {
			return fmt.Errorf("writebehind: journal: %w", err)
		}
		if !clean {
			// Only an OS crash or power loss tears a frame; what follows it was never
			// acknowledged by this file's writer.
			log.Warn("a journal file ends with a torn record; replaying what precedes it", slog.String("file", name))
		}
	}
	for _, r := range runs {
		b.TrainingRuns = append(b.TrainingRuns, r)
	}
	for _, o := range ops {
		b.Operations = append(b.Operations, o)
	}
	failed := false
	if err := st.ApplyBatch(ctx, b); err != nil {
		// As the persister does: record by record, and what still fails is logged.
		log.Error("replaying the journal as one batch failed; writing its records one by one", slog.Int("records", b.Len()), slog.Any("err", err))
		for _, r := range b.TrainingRuns {
			if err := st.PutTrainingRun(ctx, r.Workspace, r.Run); err != nil {
				log.Error("replaying training run", slog.String("run", r.Run.GetId()), slog.Any("err", err))
				failed = true
			}
		}
		for _, o := range b.Operations {
			if err := st.PutOperation(ctx, o.Workspace, o.Operation); err != nil {
				log.Error("replaying operation", slog.String("op", o.Operation.GetId()), slog.Any("err", err))
				failed = true
			}
		}
		for _, m := range b.StepMetrics {
			if err := st.ApplyBatch(ctx, store.Batch{StepMetrics: []store.OwnedStepMetrics{m}}); err != nil {
				log.Error("replaying step metrics", slog.String("run", m.RunID), slog.Int64("seq_id", m.Metrics.GetSeqId()), slog.Any("err", err))
				failed = true
			}
		}
		for _, m := range b.ReceiptSteps {
			if err := st.ApplyBatch(ctx, store.Batch{ReceiptSteps: []store.OwnedReceiptStep{m}}); err != nil {
				log.Error("replaying receipt step", slog.String("run", m.Step.GetTrainingRunId()), slog.Int64("seq_id", m.Step.GetSeqId()), slog.Any("err", err))
				failed = true
			}
		}
	}
	if failed {
		log.Error("the journal is kept, to be replayed again at the next start", slog.String("dir", dir))
		return nil
	}
	for _, name := range names {
		if err := os.Remove(name); err != nil {
			return fmt.Errorf("writebehind: journal: %w", err)
		}
	}
	log.Info("replayed the journal left by the previous process", slog.Int("files", len(names)),
		slog.Int("training_runs", len(b.TrainingRuns)), slog.Int("operations", len(b.Operations)), slog.Int("step_metrics", len(b.StepMetrics)), slog.Int("receipt_steps", len(b.ReceiptSteps)))
	return nil
}
