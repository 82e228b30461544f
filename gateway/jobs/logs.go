package jobs

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// DefaultMaxLogBytes caps a job's log file.
const DefaultMaxLogBytes = 16 << 20

// logFile is a job's log: stdout and stderr appended to one file, up to a cap (then one note
// and the rest dropped), with a channel closed at every write so that readers waiting for
// more wake up.
type logFile struct {
	f   *os.File
	max int64

	mu        sync.Mutex
	size      int64
	truncated bool
	done      bool
	changed   chan struct{}
}

func newLogFile(f *os.File, max int64) *logFile {
	return &logFile{f: f, max: max, changed: make(chan struct{})}
}

// Write appends p, up to the cap. It always reports len(p) written, so the job's output
// pipes keep draining past the cap.
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done || l.truncated {
		return len(p), nil
	}
	w := p
	room := l.max - l.size
	if int64(len(w)) > room {
		w = w[:room]
	}
	n, err := l.f.Write(w)
	l.size += int64(n)
	if err == nil && int64(len(p)) > room {
		note := fmt.Sprintf("\n[loops: the log reached its %d-byte cap; the rest of the job's output is dropped]\n", l.max)
		n, err = l.f.Write([]byte(note))
		l.size += int64(n)
		l.truncated = true
	}
	l.wake()
	if err != nil {
		return len(p), nil // a full disk must not stop the job; its log just stops
	}
	return len(p), nil
}

// wake closes the current change channel; l.mu is held.
func (l *logFile) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// state returns the log's size and a channel closed at its next change.
func (l *logFile) state() (int64, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size, l.changed
}

// finish writes a last line (the job's end) and closes the file.
func (l *logFile) finish(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	if line != "" {
		n, _ := io.WriteString(l.f, line)
		l.size += int64(n)
	}
	l.done = true
	_ = l.f.Close()
	l.wake()
}
