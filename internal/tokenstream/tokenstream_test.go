package tokenstream

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBufferTakesInOrderAndWakesOnce(t *testing.T) {
	b := NewBuffer(4)
	b.Token(0, 7, -0.5, nil)
	b.Token(1, 8, -1, nil)
	select {
	case <-b.Ready():
	default:
		t.Fatal("Ready must fire after Token")
	}
	select {
	case <-b.Ready():
		t.Fatal("one wake-up for any number of tokens")
	default:
	}
	require.Equal(t, []Token{{0, 7, -0.5, nil}, {1, 8, -1, nil}}, b.Take())
	require.Empty(t, b.Take())
}

// TestBufferOverLimitIsGone: a reader that falls more than the limit behind is dropped:
// Gone closes, the backlog is freed and later tokens are ignored, so the decoder never
// waits and memory stays bounded.
func TestBufferOverLimitIsGone(t *testing.T) {
	b := NewBuffer(2)
	b.Token(0, 1, 0, nil)
	b.Token(0, 2, 0, nil)
	select {
	case <-b.Gone():
		t.Fatal("gone too early")
	default:
	}
	b.Token(0, 3, 0, nil)
	<-b.Gone()
	require.Empty(t, b.Take())
	b.Token(0, 4, 0, nil)
	require.Empty(t, b.Take())
}

func TestCancelOnGone(t *testing.T) {
	b := NewBuffer(1)
	ctx, cancel := CancelOnGone(context.Background(), b)
	defer cancel()
	require.NoError(t, ctx.Err())
	b.Close()
	<-ctx.Done()
	b.Close() // twice is fine
}

func TestWatch(t *testing.T) {
	w := NewWatch()
	w.Token(0, 1, 0, nil)
	require.True(t, Discards(w))
	require.False(t, Discards(NewBuffer(1)))
	select {
	case <-w.Gone():
		t.Fatal("gone before Close")
	default:
	}
	ctx, cancel := CancelOnGone(t.Context(), w)
	defer cancel()
	w.Close()
	w.Close()
	<-w.Gone()
	<-ctx.Done()
}
