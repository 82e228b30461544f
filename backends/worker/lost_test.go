package worker

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
)

// TestLostIsBounded: the adapters of dead workers are remembered (to say why they are
// gone) in bounded memory, however many workers die with however many adapters: the oldest
// are forgotten past maxLost. Before, an entry went only when its adapter was created or
// deleted again, so the record grew with every adapter ever lost.
func TestLostIsBounded(t *testing.T) {
	b := &Backend{ctx: context.Background(), log: slog.New(slog.DiscardHandler), adapters: map[string]*worker{}, lost: map[string]lostEntry{}}
	for round := range 3 {
		w := &worker{b: b, alive: true, up: make(chan struct{}), addr: fmt.Sprintf("w%d", round)}
		for i := range maxLost {
			b.bind(fmt.Sprintf("r%d-a%d", round, i), w, false)
		}
		w.fail(-1, "killed")
		require.LessOrEqual(t, len(b.lost), maxLost)
	}
	// the most recent are kept, with their reason; the oldest answer a plain NotFound
	_, err := b.adapterWorker(fmt.Sprintf("r2-a%d", maxLost-1))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	require.ErrorContains(t, err, "does not exist any more: worker w2 died (killed)")
	_, err = b.adapterWorker("r0-a0")
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	require.ErrorContains(t, err, "create it with CreateAdapter first")
}

// TestLostExpires: a record is forgotten after lostTTL (a plain NotFound then), a later
// record of the same adapter outlives the place of the earlier one, and the bookkeeping of
// records removed meanwhile (their adapters created again) stays bounded.
func TestLostExpires(t *testing.T) {
	b := &Backend{lost: map[string]lostEntry{}}
	t0 := time.Now()
	b.addLostLocked("a", "first", t0)
	b.addLostLocked("b", "b", t0)
	why, ok := b.lostLocked("a", t0.Add(lostTTL-time.Second))
	require.True(t, ok)
	require.Equal(t, "first", why)
	_, ok = b.lostLocked("a", t0.Add(lostTTL))
	require.False(t, ok, "past its time")
	b.addLostLocked("a", "again", t0.Add(lostTTL/2)) // recorded again: a new place
	b.addLostLocked("c", "c", t0.Add(lostTTL))       // prunes what is past lostTTL
	require.NotContains(t, b.lost, "b")
	why, ok = b.lostLocked("a", t0.Add(lostTTL))
	require.True(t, ok, "the later record of a stays")
	require.Equal(t, "again", why)
	for i := range 10 * maxLost { // records removed at once (created again): the order is compacted
		id := fmt.Sprint("x", i)
		b.addLostLocked(id, "x", t0.Add(lostTTL))
		delete(b.lost, id)
	}
	require.LessOrEqual(t, len(b.lostOrder), 2*maxLost+1)
}
