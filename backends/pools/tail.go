package pools

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
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

// Reset forgets the kept lines (a restarted worker's output starts afresh).
func (t *Tail) Reset() {
	t.mu.Lock()
	t.lines = nil
	t.mu.Unlock()
}

// String joins the last (at most 8) kept lines, progress bars left out: the last few
// non-progress lines are what explains a failure.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keep []string
	for _, l := range t.lines {
		if !strings.Contains(l, "it/s]") {
			keep = append(keep, l)
		}
	}
	if len(keep) > 8 {
		keep = keep[len(keep)-8:]
	}
	return strings.Join(keep, " | ")
}

// KillGroup kills a worker started in its own process group (Setpgid) with everything it
// spawned (vLLM starts helpers), then the process itself.
func KillGroup(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
}
