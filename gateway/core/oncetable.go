package core

import (
	"context"
	"maps"
	"slices"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/lockorder"
)

// onceTable de-duplicates a client's retries by a sequence number (a session's
// client_seq_ids of runs and samplers, a sampler's seq_ids of samples): the first call of a
// number creates, concurrent and later calls get what it created. Its lock guards only its
// map; create runs without it.
type onceTable struct {
	mu    lockorder.Mutex[rankOnceTable]
	table map[int64]*seqClaim
}

// seqClaim is a number being created (done open) or created (id set).
type seqClaim struct {
	id   string
	done chan struct{}
}

func newOnceTable() *onceTable { return &onceTable{table: map[int64]*seqClaim{}} }

// once runs create at most once per seq, so a client's retries, concurrent or not, get what
// the first call created: fresh is true for the call that ran create. If create fails, the
// next caller tries again.
func (o *onceTable) once(ctx context.Context, seq int64, create func() (string, error)) (id string, fresh bool, err error) {
	for {
		o.mu.Lock()
		c, ok := o.table[seq]
		if !ok {
			c = &seqClaim{done: make(chan struct{})}
			o.table[seq] = c
			o.mu.Unlock()
			id, err := create()
			o.mu.Lock()
			if err != nil {
				delete(o.table, seq)
			} else {
				c.id = id
				o.pruneLocked(seq)
			}
			close(c.done)
			o.mu.Unlock()
			return id, true, err
		}
		o.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return "", false, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		if c.id != "" { // written before done was closed
			return c.id, false, nil
		}
	}
}

// pruneLocked bounds the table: once it holds 2×seqTableKeep numbers, those more than
// seqTableKeep below newest that are done are forgotten.
func (o *onceTable) pruneLocked(newest int64) {
	if len(o.table) <= 2*seqTableKeep {
		return
	}
	for seq, c := range o.table {
		if seq < newest-seqTableKeep && c.id != "" {
			delete(o.table, seq)
		}
	}
	if len(o.table) > 2*seqTableKeep { // sparse or out-of-order numbers: keep the newest only
		seqs := slices.Sorted(maps.Keys(o.table))
		for _, seq := range seqs[:len(seqs)-seqTableKeep] {
			if o.table[seq].id != "" {
				delete(o.table, seq)
			}
		}
	}
}

// len is the table's size (tests).
func (o *onceTable) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.table)
}
