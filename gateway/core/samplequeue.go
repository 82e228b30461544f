package core

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/internal/lockorder"

	"connectrpc.com/connect"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// Fair sampling. Sampling requests wait in one FIFO queue per workspace, and each free
// sampler slot (Options.SamplingConcurrency) goes to a workspace chosen by deficit round
// robin weighted by tokens: a request costs its prompt plus max_tokens × num_samples
// tokens. When no waiting workspace's deficit covers the cost of its oldest request, every
// waiting workspace gets the same credit, just enough for one of them to pay (vtime sums
// these credits); of the workspaces that can pay, the one with the most deficit takes the
// slot (ties: the one served longest ago). A workspace whose queue empties loses its credit
// (none is banked while idle), and one at its policy's sampling_concurrency neither takes a
// slot nor gains credit until one of its samples ends. Sparse workspaces go first, as in
// fq_codel: one that had nothing waiting or running and owes nothing is served at the next
// free slot, ahead of the round, and owes the cost as a negative deficit, which it keeps
// when its queue empties until the waiting workspaces have been credited as much (so a
// client that sends one request at a time cannot take more than its share by never
// queueing). So every workspace with waiting samples gets the same share of sampled
// tokens, and a workspace that sends one request while another has thousands waiting is
// served at the next free slot.
//
// Spare slots. A backend that batches sampling (the reference engine decodes the samples
// it is given together: continuous batching) lets a sample start beside running ones
// rather than after them; but a workspace that floods the slots would make a light one
// wait for the next to free. So the last spareSlots(n) free slots go only to workspaces
// with no sample running: a flooding workspace holds at most n − spare slots, and a
// workspace that sends one request finds a slot at once and joins the running batch. The
// slot count stays at 4 by default: on the CPU engine a decoding step costs about its rows,
// so larger batches trade each sample's latency for tokens/s (bench/fairness/README.md).
//
// No goroutine waits per request: a slot is a goroutine that runs a sample, then takes the
// next one the queue picks, and ends when there is none. The queue is bounded
// (Options.MaxQueuedSamples in all, Options.MaxQueuedSamplesPerWorkspace per workspace;
// over either, ResourceExhausted naming the limit), and a drain fails every waiting
// sample with Unavailable.

// maxOwed bounds the idle workspaces whose debt the queue remembers.
const maxOwed = 10000

// spareSlots is how many of n sampler slots are kept for workspaces with no sample
// running: an eighth, at least one when there are two slots or more.
func spareSlots(n int) int {
	if n < 2 {
		return 0
	}
	return max(1, n/8)
}

// sampleJob is a sampling operation waiting for a slot.
type sampleJob struct {
	o       *operation
	session string // the sampler's session, which usage is attributed to
	// deployment is the deployment sampled ("<owner>:<name>", "" for none), which usage is
	// also kept under.
	deployment string
	req        *backendv1.SampleRequest
	cost       int // tokens: prompt + max_tokens × num_samples
	// sink, when set, receives the tokens while they are decoded (SampleStream).
	sink tokenstream.Sink
	// adapter holds the sampler's checkpoint folder until the job ends (nil for the base
	// model), even if the sampler leaves memory meanwhile.
	adapter *ckfiles.Ref
	// lastN is the request's prompt_logprobs_last_n (0: the whole prompt's scores are kept).
	lastN int
	// modelPath is the checkpoint that samples (SampleResult.model_path; "" for the base model).
	modelPath string
	// queued is when it was submitted (for the time to first token).
	queued time.Time
	// poolRun is the run whose dedicated pool samples it (req.Pool), "" for the shared pools.
	poolRun string
}

// sampleCost is a sampling request's size in tokens, its weight in the round robin.
func sampleCost(req *backendv1.SampleRequest) int {
	return len(req.GetPrompt()) + int(req.GetParams().GetMaxTokens())*int(max(req.GetNumSamples(), 1))
}

// wsSamples is one workspace's queue; the entry exists while it has samples reserved,
// waiting or running.
type wsSamples struct {
	name     string
	jobs     []*sampleJob // waiting, oldest first
	reserved int          // admitted and not yet started: len(jobs) plus those being created
	running  int
	limit    int // the policy's sampling_concurrency (0: none)
	deficit  int
	fresh    bool // served ahead of the round (sparse; see the top of the file)
}

// sampleQueue is the fair sampling dispatcher.
type sampleQueue struct {
	c         *Core
	maxQueued int // all workspaces
	maxPerWS  int

	spare int // spareSlots of the slot count

	mu       lockorder.Mutex[rankSampleQueue]
	free     int // slots not running a sample
	reserved int // all workspaces' reserved
	ws       map[string]*wsSamples
	order    []*wsSamples   // workspaces with waiting samples, the one served longest ago first
	vtime    int            // credit given to every waiting workspace so far
	owed     map[string]int // idle workspaces in debt: the vtime at which it is paid
	closed   bool
	// serviceEWMA is the recent mean time a sample ran (seconds), over served samples.
	serviceEWMA float64
	served      int
}

func newSampleQueue(c *Core) *sampleQueue {
	return &sampleQueue{
		c: c, maxQueued: c.opts.MaxQueuedSamples, maxPerWS: c.opts.MaxQueuedSamplesPerWorkspace,
		free: c.opts.SamplingConcurrency, spare: spareSlots(c.opts.SamplingConcurrency),
		ws: map[string]*wsSamples{}, owed: map[string]int{},
	}
}

// reserve admits one more sample of the workspace into the queue, or says which limit it
// is over. The caller then pushes it, or gives the place back with unreserve.
func (q *sampleQueue) reserve(ws string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errShuttingDown()
	}
	if q.reserved >= q.maxQueued {
		return errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, fmt.Errorf(
			"the sampler queue is full: %d sampling requests are waiting, the server's limit (MaxQueuedSamples): retry later", q.reserved))
	}
	w := q.ws[ws]
	if w == nil {
		w = &wsSamples{name: ws, limit: q.c.policy.Limits(ws).SamplingConcurrency}
		q.ws[ws] = w
	}
	if w.reserved >= q.maxPerWS {
		return errs.New(connect.CodeResourceExhausted, errs.ReasonQueueFull, fmt.Errorf(
			"workspace %q has %d sampling requests waiting, the server's per-workspace limit (MaxQueuedSamplesPerWorkspace): wait for some to finish, then retry", ws, w.reserved))
	}
	w.reserved++
	q.reserved++
	return nil
}

// unreserve gives back a place reserve admitted and that was not pushed.
func (q *sampleQueue) unreserve(ws string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w := q.ws[ws]; w != nil {
		w.reserved--
		q.reserved--
		q.cleanLocked(w)
	}
}

// push queues a reserved sample and starts it if a slot is free. It returns false, with
// the place given back, when a shutdown began meanwhile: the caller fails the operation.
func (q *sampleQueue) push(j *sampleJob) bool {
	var refused []*sampleJob
	defer func() { // a shutdown began between the pick and the start
		for _, j := range refused {
			j.adapter.Release()
			q.c.ops.finish(j.o, nil, errShuttingDown())
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.ws[j.o.workspace]
	if q.closed {
		w.reserved--
		q.reserved--
		q.cleanLocked(w)
		return false
	}
	w.jobs = append(w.jobs, j)
	if len(w.jobs) == 1 {
		q.order = append(q.order, w)
		owes := q.owed[w.name] - q.vtime
		delete(q.owed, w.name)
		w.deficit = -max(owes, 0)
		w.fresh = w.running == 0 && owes <= 0
	}
	for q.free > 0 {
		next := q.pickLocked(q.free)
		if next == nil {
			break
		}
		q.free--
		q.c.running.Add()
		if err := q.c.life.Go("sampling", func(context.Context) { q.work(next) }); err != nil {
			q.c.running.Done()
			q.free++
			nw := q.ws[next.o.workspace]
			nw.running--
			q.cleanLocked(nw)
			refused = append(refused, next)
		}
	}
	return true
}

// work runs samples on one slot: j, then each one the queue picks next, until there is
// none. It runs on a goroutine of the core's lifecycle owner.
func (q *sampleQueue) work(j *sampleJob) {
	defer q.c.running.Done()
	for j != nil {
		q.c.runSample(j)
		q.mu.Lock()
		w := q.ws[j.o.workspace]
		w.running--
		q.cleanLocked(w)
		if j = q.pickLocked(q.free + 1); j == nil { // this slot is free too
			q.free++
		}
		q.mu.Unlock()
	}
}

// pickLocked takes the next sample to run for one of free free slots, by deficit round
// robin (see the top of the file), or nil when none may start: nothing waits, every
// waiting workspace is at its sampling_concurrency or has samples running while only spare
// slots are free, or a shutdown began. It counts the sample running.
func (q *sampleQueue) pickLocked(free int) *sampleJob {
	if q.closed || q.c.draining() {
		return nil
	}
	// blocked: w may not take a slot now (it neither takes one nor gains credit).
	blocked := func(w *wsSamples) bool {
		return (w.limit > 0 && w.running >= w.limit) || (w.running > 0 && free <= q.spare)
	}
	for i, w := range q.order {
		if w.fresh && !blocked(w) {
			return q.takeLocked(w, i)
		}
	}
	need, found := 0, false
	for _, w := range q.order {
		if blocked(w) {
			continue
		}
		if d := w.jobs[0].cost - w.deficit; !found || d < need {
			need, found = d, true
		}
	}
	if !found {
		return nil
	}
	if need > 0 {
		q.vtime += need
		for ws, paid := range q.owed {
			if paid <= q.vtime {
				delete(q.owed, ws)
			}
		}
	}
	var best *wsSamples
	at := 0
	for i, w := range q.order {
		if blocked(w) {
			continue
		}
		w.deficit += max(need, 0)
		if w.deficit >= w.jobs[0].cost && (best == nil || w.deficit > best.deficit) {
			best, at = w, i
		}
	}
	return q.takeLocked(best, at)
}

// takeLocked takes the oldest sample of w, which is q.order[at], and charges its cost.
func (q *sampleQueue) takeLocked(w *wsSamples, at int) *sampleJob {
	j := w.jobs[0]
	w.jobs[0] = nil
	w.jobs = w.jobs[1:]
	w.deficit -= j.cost
	w.fresh = false
	w.reserved--
	w.running++
	q.reserved--
	q.order = append(q.order[:at], q.order[at+1:]...)
	if len(w.jobs) == 0 {
		if w.deficit < 0 { // the debt outlives the queue; credit does not
			if len(q.owed) >= maxOwed {
				clear(q.owed) // bounded: forgive every debt
			}
			q.owed[w.name] = q.vtime - w.deficit
		}
		w.jobs, w.deficit = nil, 0
	} else {
		q.order = append(q.order, w) // served: to the back of the round
	}
	return j
}

// cleanLocked forgets a workspace with nothing reserved or running.
func (q *sampleQueue) cleanLocked(w *wsSamples) {
	if w.reserved == 0 && w.running == 0 {
		delete(q.ws, w.name)
	}
}

// position says where the sample of operation opID of workspace ws waits: how many of the
// workspace's samples are before it, and whether the workspace is held back by its
// sampling_concurrency (limit) rather than by the server's slots. ok is false when it does
// not wait in the queue (it runs, or ended).
func (q *sampleQueue) position(ws, opID string) (ahead int, atLimit bool, limit int, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.ws[ws]
	if w == nil {
		return 0, false, 0, false
	}
	for i, j := range w.jobs {
		if j.o.id == opID {
			return i, w.limit > 0 && w.running >= w.limit, w.limit, true
		}
	}
	return 0, false, 0, false
}

// remove takes operation o's sample out of the queue before it started; nil when it does
// not wait there (it runs, or ended). The caller releases the job's adapter and ends o.
func (q *sampleQueue) remove(o *operation) *sampleJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.ws[o.workspace]
	if w == nil {
		return nil
	}
	at := slices.IndexFunc(w.jobs, func(j *sampleJob) bool { return j.o == o })
	if at < 0 {
		return nil
	}
	j := w.jobs[at]
	w.jobs = slices.Delete(w.jobs, at, at+1)
	w.reserved--
	q.reserved--
	if len(w.jobs) == 0 {
		if i := slices.Index(q.order, w); i >= 0 {
			q.order = slices.Delete(q.order, i, i+1)
		}
		if w.deficit < 0 { // as takeLocked: the debt outlives the queue; credit does not
			if len(q.owed) >= maxOwed {
				clear(q.owed)
			}
			q.owed[w.name] = q.vtime - w.deficit
		}
		w.jobs, w.deficit = nil, 0
	}
	q.cleanLocked(w)
	return j
}

// served records the time a sample ran, for the queue's wait estimates.
func (q *sampleQueue) observe(d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.served++; q.served == 1 {
		q.serviceEWMA = d.Seconds()
	} else {
		q.serviceEWMA = 0.8*q.serviceEWMA + 0.2*d.Seconds()
	}
}

// meanService is the recent mean time a sample ran (0: none ran yet).
func (q *sampleQueue) meanService() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return time.Duration(q.serviceEWMA * float64(time.Second))
}

// slots is the number of sampler slots.
func (q *sampleQueue) slots() int { return q.c.opts.SamplingConcurrency }

// waiting returns how many of the workspace's samples wait for a slot.
func (q *sampleQueue) waiting(ws string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w := q.ws[ws]; w != nil {
		return len(w.jobs)
	}
	return 0
}

// close refuses new samples and fails the waiting ones with Unavailable (Drain calls it);
// running samples go on.
func (q *sampleQueue) close() {
	q.mu.Lock()
	q.closed = true
	var failed []*sampleJob
	for _, w := range q.order {
		failed = append(failed, w.jobs...)
		w.reserved -= len(w.jobs)
		q.reserved -= len(w.jobs)
		w.jobs, w.deficit = nil, 0
		q.cleanLocked(w)
	}
	q.order = nil
	q.mu.Unlock()
	for _, j := range failed {
		j.adapter.Release()
		q.c.ops.finish(j.o, nil, errShuttingDown())
	}
}
