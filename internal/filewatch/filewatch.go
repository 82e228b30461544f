package filewatch

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

// Options say what a Watcher watches.
type Options[T any] struct {
	// Flag names the file in errors ("--prices"), What in logs ("price sheet").
	Flag, What string
	// MaxBytes bounds what is read of the file: Parse gets at most MaxBytes+1 bytes and
	// refuses more.
	MaxBytes int64
	// Parse parses and validates the file's contents.
	Parse func([]byte) (*T, error)
	// Version, when set, describes a value in the logs.
	Version func(*T) string
}

// Watcher holds the value parsed from a file, reloaded when the file changes. A nil
// Watcher holds nil.
type Watcher[T any] struct {
	file    string
	o       Options[T]
	log     *slog.Logger
	current atomic.Pointer[T]
	// mu serializes polls; stamp is the file's modification time and size when it was
	// last read.
	mu    sync.Mutex
	stamp fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// Load reads and parses file: an error names the flag, the file and what Parse said.
func Load[T any](file string, o Options[T], log *slog.Logger) (*Watcher[T], error) {
	w := &Watcher[T]{file: file, o: o, log: log}
	v, stamp, err := w.read()
	if err != nil {
		return nil, err
	}
	w.current.Store(v)
	w.stamp = stamp
	log.Info(o.What+" loaded", slog.String("file", file), slog.String("version", w.version(v)))
	return w, nil
}

// Current is the value in force now (nil for a nil Watcher).
func (w *Watcher[T]) Current() *T {
	if w == nil {
		return nil
	}
	return w.current.Load()
}

// Run polls the file every PollInterval until ctx ends.
func (w *Watcher[T]) Run(ctx context.Context) { w.Follow(ctx, nil) }

// Follow polls the file every PollInterval until ctx ends, and calls changed (when not nil)
// with each new value put in force (Reload).
func (w *Watcher[T]) Follow(ctx context.Context, changed func(*T)) {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Reload(changed)
		}
	}
}

// Reload polls the file once (Poll) and, when a new value is in force, calls changed (when
// not nil) with it.
func (w *Watcher[T]) Reload(changed func(*T)) {
	if w.Poll() && changed != nil {
		changed(w.Current())
	}
}

// Poll reloads the file once when it changed (Run calls it), and reports whether a new
// value is in force.
func (w *Watcher[T]) Poll() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	fi, err := os.Stat(w.file)
	if err != nil {
		w.log.Error(w.o.What+": cannot read the file; the one in force is kept", slog.String("file", w.file), slog.Any("err", err), slog.String("version", w.version(w.Current())))
		return false
	}
	if (fileStamp{fi.ModTime(), fi.Size()}) == w.stamp {
		return false
	}
	v, stamp, err := w.read()
	w.stamp = stamp // a bad file is not read again until it changes
	if err != nil {
		w.log.Error(w.o.What+": the changed file is refused; the one in force is kept", slog.String("file", w.file), slog.Any("err", err), slog.String("version", w.version(w.Current())))
		return false
	}
	old := w.current.Swap(v)
	w.log.Info(w.o.What+" reloaded: new work follows it", slog.String("file", w.file), slog.String("version", w.version(v)), slog.String("previous", w.version(old)))
	return true
}

func (w *Watcher[T]) version(v *T) string {
	if w.o.Version == nil || v == nil {
		return ""
	}
	return w.o.Version(v)
}

func (w *Watcher[T]) read() (*T, fileStamp, error) {
	f, err := os.Open(w.file)
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("%s: %w", w.o.Flag, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("%s: %w", w.o.Flag, err)
	}
	stamp := fileStamp{fi.ModTime(), fi.Size()}
	data, err := io.ReadAll(io.LimitReader(f, w.o.MaxBytes+1))
	if err != nil {
		return nil, stamp, fmt.Errorf("%s %s: %w", w.o.Flag, w.file, err)
	}
	v, err := w.o.Parse(data)
	if err != nil {
		return nil, stamp, fmt.Errorf("%s %s: %w", w.o.Flag, w.file, err)
	}
	return v, stamp, nil
}
