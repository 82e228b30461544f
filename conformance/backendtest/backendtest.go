package backendtest

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/conformance/oracle"
)

// Factory starts a backend for one case of the suite. The backend must serve the model
// Options.ModelName, whose weights are in Options.ModelDir. The suite calls Close when the
// case ends. A factory may hand out one shared backend to every case (Close then does
// nothing): every case uses adapter ids of its own and deletes them when it ends.
type Factory func(t *testing.T) backends.Backend

// Options configure Run.
type Options struct {
	// ModelName is the base model name the backend serves, e.g. "loops/tiny".
	ModelName string
	// ModelDir is that model's Hugging Face folder (config.json, *.safetensors,
	// tokenizer.json); the oracle reads the same weights from it.
	ModelDir string
	// KnownFailing is the path of a known-failures file (empty: none). Each line is
	// "pattern  # reason"; blank lines and lines starting with # are ignored. A pattern is
	// matched with path.Match against a case name and against each of its parent groups
	// ("sample/*" covers "sample/stop/token"). A listed case that fails is skipped with the
	// reason; a listed case that passes fails, so the file never goes stale.
	KnownFailing string
	// LogprobTolerance is the absolute tolerance on log-probabilities (default 1e-4).
	LogprobTolerance float64
}

// Tolerances of the suite: a float32 backend against the float64 oracle.
const (
	// DefaultLogprobTolerance is the absolute tolerance on every log-probability.
	DefaultLogprobTolerance = 1e-4
	// GradientTolerance is the tolerance on gradients, relative to the gradient's norm
	// (directional derivatives) or to the coordinate's magnitude (single coordinates).
	GradientTolerance = 2e-3
	// UpdateTolerance is the absolute tolerance on an optimizer update, relative to the
	// learning rate, on top of 1e-7 for float32 weights.
	UpdateTolerance = 1e-3
)

type knownFailure struct {
	pattern, reason string
	used            bool
}

func readKnownFailing(file string) ([]*knownFailure, error) {
	if file == "" {
		return nil, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*knownFailure
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pat, reason, _ := strings.Cut(line, "#")
		pat, reason = strings.TrimSpace(pat), strings.TrimSpace(reason)
		if reason == "" {
			return nil, fmt.Errorf("%s:%d: pattern %q has no '# reason'", file, n, pat)
		}
		if _, err := path.Match(pat, ""); err != nil {
			return nil, fmt.Errorf("%s:%d: bad pattern %q: %w", file, n, pat, err)
		}
		out = append(out, &knownFailure{pattern: pat, reason: reason})
	}
	return out, sc.Err()
}

func matchKnown(kf []*knownFailure, name string) *knownFailure {
	parts := strings.Split(name, "/")
	for _, k := range kf {
		for i := len(parts); i >= 1; i-- {
			if ok, _ := path.Match(k.pattern, strings.Join(parts[:i], "/")); ok {
				k.used = true
				return k
			}
		}
	}
	return nil
}

// ct is the testing.T a case sees. It runs the case in a goroutine of its own, so that
// FailNow (and so require) can end a known-failing case without failing the test.
type ct struct {
	*testing.T
	expectFail bool

	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (c *ct) fail(msg string) {
	c.mu.Lock()
	c.failed = true
	if msg != "" {
		c.msgs = append(c.msgs, msg)
	}
	c.mu.Unlock()
	switch {
	case c.expectFail && msg != "":
		c.T.Log("known failing: " + msg)
	case c.expectFail:
	case msg != "":
		c.T.Error(msg)
	default:
		c.T.Fail()
	}
}

// Errorf records a failure.
func (c *ct) Errorf(format string, args ...any) { c.fail(fmt.Sprintf(format, args...)) }

// Error records a failure.
func (c *ct) Error(args ...any) { c.fail(fmt.Sprint(args...)) }

// Fail records a failure.
func (c *ct) Fail() { c.fail("") }

// FailNow records a failure and ends the case.
func (c *ct) FailNow() {
	c.fail("")
	runtime.Goexit()
}

// Fatalf records a failure and ends the case.
func (c *ct) Fatalf(format string, args ...any) {
	c.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// Fatal records a failure and ends the case.
func (c *ct) Fatal(args ...any) {
	c.fail(fmt.Sprint(args...))
	runtime.Goexit()
}

// Failed reports whether the case has failed.
func (c *ct) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// stats keeps the largest error measured per quantity over the whole run.
type stats struct {
	mu  sync.Mutex
	max map[string]float64
	at  map[string]string
}

func (s *stats) note(what, where string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.max[what]; !ok || v > cur || math.IsNaN(v) {
		s.max[what] = v
		s.at[what] = where
	}
}

type testCase struct {
	name string
	fn   func(h *harness)
}

// Run runs the backend contract suite: each case is a subtest with a stable name such as
// "loss/ppo/clip_config". Expected values come from the float64 oracle (package
// conformance/oracle) reading Options.ModelDir and the adapter folders the backend saves.
func Run(t *testing.T, factory Factory, opts Options) {
	require.NotEmpty(t, opts.ModelName, "Options.ModelName is required")
	require.NotEmpty(t, opts.ModelDir, "Options.ModelDir is required")
	if opts.LogprobTolerance == 0 {
		opts.LogprobTolerance = DefaultLogprobTolerance
	}
	kf, err := readKnownFailing(opts.KnownFailing)
	require.NoError(t, err)
	model, err := oracle.LoadModel(opts.ModelDir)
	require.NoError(t, err, "the oracle cannot read the model folder")
	dec, err := oracle.LoadDecoder(opts.ModelDir)
	require.NoError(t, err, "the oracle cannot read tokenizer.json")
	t.Logf("oracle model: %s", model)
	st := &stats{max: map[string]float64{}, at: map[string]string{}}
	start := time.Now()
	ran := 0
	for _, tc := range allCases() {
		t.Run(tc.name, func(t *testing.T) {
			ran++
			known := matchKnown(kf, tc.name)
			c := &ct{T: t, expectFail: known != nil}
			b := factory(t)
			require.NotNil(t, b, "the factory returned no backend")
			t.Cleanup(func() { _ = b.Close() })
			h := newHarness(c, b, model, dec, opts, st, tc.name)
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer func() {
					if r := recover(); r != nil {
						c.fail(fmt.Sprintf("panic: %v\n%s", r, debug.Stack()))
					}
				}()
				defer h.cleanup()
				tc.fn(h)
			}()
			<-done
			switch {
			case known != nil && c.Failed():
				t.Skipf("known failing (%s): %s", opts.KnownFailing, known.reason)
			case known != nil:
				t.Errorf("this case passes but matches %q in %s (%s); remove that line", known.pattern, opts.KnownFailing, known.reason)
			}
		})
	}
	for _, k := range kf {
		if !k.used && ran == len(allCases()) {
			t.Errorf("known-failing pattern %q in %s matches no case", k.pattern, opts.KnownFailing)
		}
	}
	keys := make([]string, 0, len(st.max))
	for k := range st.max {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-40s %.3g  (%s)", k, st.max[k], st.at[k])
	}
	t.Logf("backend contract suite: %d cases in %v; largest measured errors:%s", ran, time.Since(start).Round(time.Millisecond), b.String())
}
