package core

// Fair batching. Each lane round, the ready forward/backward heads are chosen by deficit
// round robin over workspaces, weighted by tokens: every workspace with such work gets a
// quantum of MaxBatchTokens / (workspaces with work) tokens added to its deficit, and its
// runs' heads go into the round, in the order they became ready, while the deficit covers
// them; the rest wait for the next round, with the deficit they kept. A workspace with
// nothing left waiting loses its deficit (it cannot bank credit while idle). So a
// workspace that floods the lane with many runs gets the same share of each round's
// batch as one that sends a single run, and the light one's work goes into the next
// batch instead of waiting behind the flood. Runs' other tasks (barriers) are not
// batch capacity and are never deferred.

// fairShare splits the ready runs into those to run this round (non-batched heads, and
// the forward/backward heads that deficit round robin admits, interleaved by workspace so
// that every batch carries several workspaces' work) and those deferred to the next round.
// It updates the lane's deficits. Called only from the lane's goroutine.
func (l *lane) fairShare(rs []*run) (now, later []*run) {
	byWS := map[string][]*run{}
	tokens := map[*run]int{}
	var order []string
	for _, r := range rs {
		h := r.PeekHead()
		if !h.FB {
			now = append(now, r)
			continue
		}
		tokens[r] = h.Tokens
		if _, seen := byWS[r.Workspace()]; !seen {
			order = append(order, r.Workspace())
		}
		byWS[r.Workspace()] = append(byWS[r.Workspace()], r)
	}
	if len(order) == 0 {
		clear(l.deficit)
		return now, nil
	}
	quantum := max(l.maxBatchTokens/len(order), 1)
	admitted := make([][]*run, len(order))
	for i, ws := range order {
		d := l.deficit[ws] + quantum
		runs := byWS[ws]
		n := 0
		for ; n < len(runs); n++ {
			t := tokens[runs[n]]
			if t > d {
				break
			}
			d -= t
		}
		admitted[i] = runs[:n]
		later = append(later, runs[n:]...)
		if n == len(runs) {
			delete(l.deficit, ws) // nothing left waiting: no credit kept
		} else {
			l.deficit[ws] = d
		}
	}
	for ws := range l.deficit {
		if _, active := byWS[ws]; !active {
			delete(l.deficit, ws)
		}
	}
	// Interleave: one run of each workspace in turn.
	for i := 0; ; i++ {
		added := false
		for _, a := range admitted {
			if i < len(a) {
				now = append(now, a[i])
				added = true
			}
		}
		if !added {
			break
		}
	}
	return now, later
}

// requeue puts deferred runs back at the front of the ready list, in their order.
func (l *lane) requeue(rs []*run) {
	if len(rs) == 0 {
		return
	}
	l.mu.Lock()
	l.ready = append(rs, l.ready...)
	l.mu.Unlock()
}
