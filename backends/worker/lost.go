package worker

import "time"

// The backend remembers why adapters are gone (their worker died or was replaced), so that
// a call naming one answers NotFound with the reason: the gateway then reloads the run's
// checkpoint. A record goes when its adapter is created, loaded or deleted again, after
// lostTTL, or, past maxLost records, oldest first: without one the answer is the same
// NotFound, only without the reason.
const (
	maxLost = 4096
	lostTTL = time.Hour
)

// lostEntry is why an adapter is gone, since when, and its place in Backend.lostOrder.
type lostEntry struct {
	why string
	at  time.Time
	seq uint64
}

// lostRef is a place in Backend.lostOrder: the record of id made with seq (a later record
// of the same id has another seq).
type lostRef struct {
	id  string
	seq uint64
}

// addLostLocked records that adapter id is gone, and forgets the records past lostTTL or
// maxLost. b.mu held.
func (b *Backend) addLostLocked(id, why string, now time.Time) {
	b.lostSeq++
	b.lost[id] = lostEntry{why: why, at: now, seq: b.lostSeq}
	b.lostOrder = append(b.lostOrder, lostRef{id, b.lostSeq})
	b.pruneLostLocked(now)
}

// lostLocked returns why adapter id is gone, if that is remembered and not past lostTTL.
// b.mu held.
func (b *Backend) lostLocked(id string, now time.Time) (string, bool) {
	e, ok := b.lost[id]
	if !ok || now.Sub(e.at) >= lostTTL {
		return "", false
	}
	return e.why, true
}

// pruneLostLocked forgets the oldest records while they are past lostTTL or more than
// maxLost are kept, and drops the places of records already gone. b.mu held.
func (b *Backend) pruneLostLocked(now time.Time) {
	i := 0
	for ; i < len(b.lostOrder); i++ {
		ref := b.lostOrder[i]
		e, ok := b.lost[ref.id]
		if !ok || e.seq != ref.seq {
			continue // removed, or recorded again later
		}
		if now.Sub(e.at) < lostTTL && len(b.lost) <= maxLost {
			break
		}
		delete(b.lost, ref.id)
	}
	b.lostOrder = b.lostOrder[i:]
	if len(b.lostOrder) > 2*maxLost { // places of records removed since: compact
		kept := b.lostOrder[:0]
		for _, ref := range b.lostOrder {
			if e, ok := b.lost[ref.id]; ok && e.seq == ref.seq {
				kept = append(kept, ref)
			}
		}
		clear(b.lostOrder[len(kept):])
		b.lostOrder = kept
	}
}
