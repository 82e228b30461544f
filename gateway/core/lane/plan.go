package lane

import "slices"

// Fair batching (Plan). Each plan, the ready forward/backward pieces are chosen by deficit
// round robin over workspaces, weighted by tokens: every workspace with pieces waiting that
// has no batch in flight gets a quantum of MaxBatchTokens / (such workspaces) tokens added
// to its deficit, and its pieces go into the batch, in the order they became ready, while
// the deficit covers them; the rest wait for the next batch with the deficit they kept. A
// workspace with nothing left waiting loses its deficit (no credit is banked while idle),
// and one whose batch is in flight neither joins nor gains credit. So a workspace that
// floods the lane with many runs gets the same share of a batch as one that sends a single
// run. Barriers are not batch capacity and are never deferred.

// Candidate is a piece of work a plan may schedule: a ready run's head, or the next piece
// of a forward/backward task the lane is part-way through.
type Candidate struct {
	Workspace string
	FB        bool // forward/backward work (batched); otherwise a barrier
	Tokens    int  // the piece's tokens (forward/backward)
}

// Decision is what a plan does with the candidates, by index.
type Decision struct {
	Barriers []int // run now, each on a goroutine of its own
	Batch    []int // one backend call, interleaved by workspace
	Later    []int // wait for a later plan
}

// Planner keeps the workspaces' deficits between plans. Its zero value is not usable: use
// NewPlanner. It is used by the lane's goroutine only.
type Planner struct {
	maxBatchTokens int
	deficit        map[string]int
}

// NewPlanner returns a planner of batches of at most maxBatchTokens tokens.
func NewPlanner(maxBatchTokens int) *Planner {
	return &Planner{maxBatchTokens: max(maxBatchTokens, 1), deficit: map[string]int{}}
}

// Plan decides what of cands runs now. busy names the workspaces with a batch in flight;
// with canBatch false (no free executor) no batch is formed and deficits do not move. The
// batch holds at least one piece whenever a workspace that is not busy has one and
// canBatch is true, and at most maxBatchTokens tokens unless a single piece is larger.
func (p *Planner) Plan(cands []Candidate, busy map[string]bool, canBatch bool) Decision {
	var d Decision
	byWS := map[string][]int{}
	var order []string
	for i, c := range cands {
		switch {
		case !c.FB:
			d.Barriers = append(d.Barriers, i)
		case busy[c.Workspace] || !canBatch:
			d.Later = append(d.Later, i)
		default:
			if _, seen := byWS[c.Workspace]; !seen {
				order = append(order, c.Workspace)
			}
			byWS[c.Workspace] = append(byWS[c.Workspace], i)
		}
	}
	if !canBatch {
		return d // no batch now: deficits stay as they are
	}
	// A workspace that has no piece waiting keeps no credit; a busy one keeps what it had
	// (it is waiting for its batch, not idle).
	for ws := range p.deficit {
		if _, active := byWS[ws]; !active && !busy[ws] {
			delete(p.deficit, ws)
		}
	}
	if len(order) == 0 {
		return d
	}
	quantum := max(p.maxBatchTokens/len(order), 1)
	admitted := make([][]int, len(order))
	for len(d.Batch) == 0 {
		for w, ws := range order {
			if len(admitted[w]) > 0 {
				continue
			}
			credit := p.deficit[ws] + quantum
			idx := byWS[ws]
			n := 0
			for ; n < len(idx) && cands[idx[n]].Tokens <= credit; n++ {
				credit -= cands[idx[n]].Tokens
			}
			admitted[w] = idx[:n]
			p.deficit[ws] = credit
		}
		d.Batch = interleave(admitted)
	}
	// Cut the batch at maxBatchTokens (carried credit can admit more than one batch's
	// worth); the pieces cut are refunded to their workspace.
	total, cut := 0, len(d.Batch)
	for i, ci := range d.Batch {
		if i > 0 && total+cands[ci].Tokens > p.maxBatchTokens {
			cut = i
			break
		}
		total += cands[ci].Tokens
	}
	for _, ci := range d.Batch[cut:] {
		p.deficit[cands[ci].Workspace] += cands[ci].Tokens
	}
	inBatch := map[int]bool{}
	for _, ci := range d.Batch[:cut] {
		inBatch[ci] = true
	}
	d.Batch = d.Batch[:cut]
	for _, ws := range order {
		left := false
		for _, ci := range byWS[ws] {
			if !inBatch[ci] {
				d.Later = append(d.Later, ci)
				left = true
			}
		}
		if !left {
			delete(p.deficit, ws) // nothing left waiting: no credit kept
		}
	}
	return d
}

// interleave takes one index of each workspace in turn.
func interleave(per [][]int) []int {
	var out []int
	for i := 0; ; i++ {
		added := false
		for _, a := range per {
			if i < len(a) {
				out = append(out, a[i])
				added = true
			}
		}
		if !added {
			return out
		}
	}
}

// Credit is a workspace's deficit (tests).
func (p *Planner) Credit(ws string) int { return p.deficit[ws] }

// Express plans the express batch with p, a planner of its own whose maxBatchTokens is the
// express limit, after d (another planner's decision over cands) and returns d without it
// and the express batch (indices into cands). It takes the work of workspaces whose pieces
// in d come to at most the limit in all, either left for later (every batch is running) or
// planned into a batch that holds more than the limit of other workspaces' work, so a small
// step waits neither for several floods' batches nor for a flood's piece in its own batch.
// Workspaces in busy are not taken, nor one whose many small steps add up to more than the
// limit; the express batch is shared between its workspaces by p's deficit round robin. A
// batch of small work alone stays as it is, one batch.
func (p *Planner) Express(cands []Candidate, busy map[string]bool, d Decision) (Decision, []int) {
	limit := p.maxBatchTokens
	waiting := map[string]int{} // tokens of each workspace's pieces in d
	for _, i := range append(slices.Clone(d.Batch), d.Later...) {
		if c := cands[i]; c.FB && !busy[c.Workspace] {
			waiting[c.Workspace] += c.Tokens
		}
	}
	small := func(ws string) bool { n, ok := waiting[ws]; return ok && n <= limit }
	total := 0
	for _, i := range d.Batch {
		total += cands[i].Tokens
	}
	var idx []int
	var sub []Candidate
	for _, i := range d.Batch {
		if ws := cands[i].Workspace; small(ws) && total-waiting[ws] > limit {
			idx = append(idx, i)
			sub = append(sub, cands[i])
		}
	}
	if len(d.Batch) == 0 {
		for _, i := range d.Later {
			if c := cands[i]; c.FB && small(c.Workspace) {
				idx = append(idx, i)
				sub = append(sub, c)
			}
		}
	}
	if len(sub) == 0 {
		return d, nil
	}
	e := p.Plan(sub, busy, true)
	fast := make([]int, 0, len(e.Batch))
	chosen := map[int]bool{}
	for _, j := range e.Batch {
		fast = append(fast, idx[j])
		chosen[idx[j]] = true
	}
	// What was taken out of d's batch but does not fit the express batch waits; the rest of
	// d is unchanged.
	inBatch := map[int]bool{}
	for _, i := range d.Batch {
		inBatch[i] = true
	}
	for _, i := range idx {
		if !chosen[i] && inBatch[i] {
			d.Later = append(d.Later, i)
		}
	}
	taken := map[int]bool{}
	for _, i := range idx {
		taken[i] = true
	}
	d.Batch = slices.DeleteFunc(d.Batch, func(i int) bool { return taken[i] })
	d.Later = slices.DeleteFunc(d.Later, func(i int) bool { return chosen[i] })
	return d, fast
}
