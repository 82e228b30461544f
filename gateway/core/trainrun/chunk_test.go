package trainrun

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChunkData: pieces of consecutive datums within the budget, a datum over it alone,
// boundaries from the data alone.
func TestChunkData(t *testing.T) {
	id := func(n int) int { return n }
	require.Equal(t, []Chunk{{0, 3, 90}, {3, 4, 100}, {4, 6, 60}}, ChunkData([]int{30, 30, 30, 100, 30, 30}, 100, id))
	require.Equal(t, []Chunk{{0, 1, 500}, {1, 2, 40}}, ChunkData([]int{500, 40}, 100, id), "a datum over the budget is a piece of its own")
	require.Empty(t, ChunkData([]int{}, 100, id))
	require.Equal(t, []Chunk{{0, 2, 200}}, ChunkData([]int{100, 100}, 200, id))
}
