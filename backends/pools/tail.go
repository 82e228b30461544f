package pools

import (
	"strings"
	"sync"
)

// Tail keeps the last lines of a worker's output for error messages. Safe for concurrent
// use.
type Tail struct {
	mu    sync.Mutex
	n     int
	lines []string
}

// NewTail keeps the last n lines.
func NewTail(n int) *Tail { return &Tail{n: n} }

// Add appends a line (long lines are cut to 512 bytes).
func (t *Tail) Add(s string) {
	if len(s) > 512 {
		s = s[:512]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, s)
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

// String joins the kept lines, progress bars left out.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keep []string
	for _, l := range t.lines {
		if !strings.Contains(l, "it/s]") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, " | ")
}
