package core

import (
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/semantics"
)

// Limits bound what the core holds in memory, so that memory stays flat however many
// sessions, runs and samplers come and go. A refusing cap answers ResourceExhausted (HTTP
// 429) with a Retry-After and a message that names the limit; an evicting bound drops what
// is idle from memory only (the store keeps it and it is reloaded on demand). Zero values
// take the defaults; docs/semantics.md ("Limits") lists them all.
type Limits struct {
	// MaxPendingPerRun caps the operations queued on one run, not yet running (default
	// 1024). Past it a request is refused (429, reason QUEUE_FULL) without using its seq_id,
	// so the client's retry of the same seq_id is accepted once the queue drains.
	MaxPendingPerRun int
	// MaxSessionsPerWorkspace caps the live sessions of one workspace (default 1000);
	// ending or expiring sessions frees room (429, reason LIMIT_REACHED).
	MaxSessionsPerWorkspace int
	// MaxRunsPerSession caps the training runs one session creates (default 1000).
	MaxRunsPerSession int
	// MaxProjectsPerWorkspace caps the projects of one workspace, its default project
	// included (default 100); deleting projects frees room (429, reason LIMIT_REACHED).
	MaxProjectsPerWorkspace int
	// MaxSamplersPerSession caps the samplers one session creates (default 100000).
	MaxSamplersPerSession int
	// MaxSamplersInMemory bounds the samplers of one workspace held in memory (default
	// 1024): past it the least recently used one is dropped from memory. A dropped sampler
	// still works: the next request that names it reloads it from the store.
	MaxSamplersInMemory int
	// SamplerIdleTTL: a sampler unused this long is dropped from memory (default 10 min);
	// like MaxSamplersInMemory this is an eviction, not an end: it reloads on demand.
	SamplerIdleTTL time.Duration
	// RunIdleTTL: a run that holds no adapter (unloaded: its session ended, it was unloaded
	// or its creation failed) and had no request this long is dropped from memory (default
	// 1 min); the next request that names it reloads its record from the store, and an
	// unloaded run refuses work with its reason as before.
	RunIdleTTL time.Duration
	// LiveRunIdleTTL: the same for a run that still takes work but holds no adapter (one
	// recovered after a restart and not used since); default 10 min.
	LiveRunIdleTTL time.Duration
	// MaxReplayBytesPerRun bounds a run's replay log (recovery.go: the forward_backward
	// items and optim_steps since its last stored snapshot; default 256 MiB). Past it the
	// log is dropped, and a lost replica costs the run's steps since its last checkpoint
	// until the next snapshot is stored.
	MaxReplayBytesPerRun int
	// MaxReplayBytesTotal bounds the replay logs of all runs together (default 2 GiB): a
	// run whose call would pass it has its log dropped as if it passed its own bound.
	MaxReplayBytesTotal int
	// MaxReceiptStepsPerRun caps the steps a run's receipt lists (docs/receipts.md;
	// default 100000): later steps are not recorded and the receipt says truncated.
	MaxReceiptStepsPerRun int
	// MaxRecordDataBytesPerRun caps the bytes of batches a run recording data
	// (record_data) keeps in the checkpoint store (default 1 GiB): past it recording stops,
	// and the receipt says where and why.
	MaxRecordDataBytesPerRun int
	// RetryAfter is the hint sent with a refusing cap's 429 (default 1 s).
	RetryAfter time.Duration
}

func (l *Limits) defaults() {
	setDefault(&l.MaxPendingPerRun, 1024)
	setDefault(&l.MaxSessionsPerWorkspace, 1000)
	setDefault(&l.MaxRunsPerSession, 1000)
	setDefault(&l.MaxProjectsPerWorkspace, 100)
	setDefault(&l.MaxSamplersPerSession, 100000)
	setDefault(&l.MaxSamplersInMemory, semantics.MaxSamplersInMemory)
	setDefault(&l.SamplerIdleTTL, 10*time.Minute)
	setDefault(&l.RunIdleTTL, time.Minute)
	setDefault(&l.LiveRunIdleTTL, 10*time.Minute)
	setDefault(&l.MaxReplayBytesPerRun, 256<<20)
	setDefault(&l.MaxReplayBytesTotal, 2<<30)
	setDefault(&l.MaxReceiptStepsPerRun, 100000)
	setDefault(&l.MaxRecordDataBytesPerRun, 1<<30)
	setDefault(&l.RetryAfter, time.Second)
}

func setDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// seqTableKeep is how many of the newest client_seq_ids a session's de-duplication tables
// (runs, samplers) remember once they hold twice as many: retries come within minutes, not
// thousands of creations later.
const seqTableKeep = sequencer.Keep

// limitReached answers a refusing cap: ResourceExhausted with reason, the limit's name
// and the retry hint.
func (c *Core) limitReached(reason, limit string, format string, args ...any) error {
	return errs.Limit(connect.CodeResourceExhausted, reason, limit, c.opts.Limits.RetryAfter, fmt.Errorf(format, args...))
}
