package prices

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// PollInterval is how often a Watcher looks at its file for a change.
const PollInterval = 2 * time.Second

// Watcher holds the price sheet in force, loaded from a file and reloaded when the file
// changes. A nil Watcher has no sheet.
type Watcher struct {
	file    string
	log     *slog.Logger
	now     func() time.Time
	current atomic.Pointer[Sheet]
	// mu serializes polls; stamp is the file's modification time and size when it was
	// last read.
	mu    sync.Mutex
	stamp fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// Load reads and parses the sheet in file: an error names the line or field, and a server
// refuses to start on it.
func Load(file string, log *slog.Logger) (*Watcher, error) {
	w := &Watcher{file: file, log: log, now: time.Now}
	s, stamp, err := w.read()
	if err != nil {
		return nil, err
	}
	w.current.Store(s)
	w.stamp = stamp
	log.Info("price sheet loaded", slog.String("file", file), slog.String("version", s.Version()))
	return w, nil
}

// Current is the sheet in force now (nil: no prices).
func (w *Watcher) Current() *Sheet {
	if w == nil {
		return nil
	}
	return w.current.Load()
}

// Run polls the file every PollInterval until ctx ends, and reloads it when its
// modification time or size changed. A sheet that does not parse is logged and the one in
// force kept.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Poll()
		}
	}
}

// Poll reloads the sheet once when its file changed; Run calls it.
func (w *Watcher) Poll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	fi, err := os.Stat(w.file)
	if err != nil {
		w.log.Error("price sheet: cannot read the file; the sheet in force is kept", slog.String("file", w.file), slog.Any("err", err), slog.String("version", w.Current().Version()))
		return
	}
	if (fileStamp{fi.ModTime(), fi.Size()}) == w.stamp {
		return
	}
	s, stamp, err := w.read()
	w.stamp = stamp // a bad file is not read again until it changes
	if err != nil {
		w.log.Error("price sheet: the changed file is refused; the sheet in force is kept", slog.String("file", w.file), slog.Any("err", err), slog.String("version", w.Current().Version()))
		return
	}
	old := w.current.Swap(s)
	w.log.Info("price sheet reloaded: new work is priced with it", slog.String("file", w.file), slog.String("version", s.Version()), slog.String("previous", old.Version()))
}

func (w *Watcher) read() (*Sheet, fileStamp, error) {
	f, err := os.Open(w.file)
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("--prices: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("--prices: %w", err)
	}
	stamp := fileStamp{fi.ModTime(), fi.Size()}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, stamp, fmt.Errorf("--prices %s: %w", w.file, err)
	}
	s, err := Parse(data, w.now())
	if err != nil {
		return nil, stamp, fmt.Errorf("--prices %s: %w", w.file, err)
	}
	return s, stamp, nil
}
