package lane

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlanSharesBatchesByWorkspace: each workspace with work gets an equal share of a batch,
// however many runs it floods with; barriers always run; a busy workspace waits without
// gaining credit; a big piece is admitted once enough credit accumulated.
func TestPlanSharesBatchesByWorkspace(t *testing.T) {
	p := NewPlanner(100)
	var cands []Candidate
	for range 8 {
		cands = append(cands, Candidate{Workspace: "flood", FB: true, Tokens: 20})
	}
	cands = append(cands, Candidate{Workspace: "light", FB: true, Tokens: 20}, Candidate{Workspace: "x", FB: false})
	d := p.Plan(cands, nil, true)
	require.Equal(t, []int{9}, d.Barriers)
	require.Equal(t, []int{0, 8, 1}, d.Batch, "50 tokens each: two of the flood's, the light one's, interleaved")
	require.ElementsMatch(t, []int{2, 3, 4, 5, 6, 7}, d.Later)
	require.Equal(t, 10, p.Credit("flood"))
	require.Zero(t, p.Credit("light"), "nothing left waiting: no credit kept")

	d = p.Plan(cands[:8], map[string]bool{"flood": true}, true)
	require.Empty(t, d.Batch, "a workspace with a batch in flight waits")
	require.Len(t, d.Later, 8)
	require.Equal(t, 10, p.Credit("flood"), "and gains no credit meanwhile")

	d = p.Plan(cands[:8], nil, false)
	require.Empty(t, d.Batch, "no free executor: no batch")
	require.Equal(t, 10, p.Credit("flood"))

	q := NewPlanner(100)
	d = q.Plan([]Candidate{{Workspace: "a", FB: true, Tokens: 300}, {Workspace: "b", FB: true, Tokens: 30}}, nil, true)
	require.Equal(t, []int{1}, d.Batch, "b's small piece goes first")
	d = q.Plan([]Candidate{{Workspace: "a", FB: true, Tokens: 300}}, nil, true)
	require.Equal(t, []int{0}, d.Batch, "a's big piece runs once its credit covers it, alone")
}

// TestExpressTakesSmallStepsOutOfFloodedBatches: a workspace whose waiting pieces are all
// small goes in the express batch when every batch is running, or instead of sharing a
// batch with other workspaces' big pieces; a workspace with any big piece, one that is
// busy, and a batch of small pieces alone are left as they were.
func TestExpressTakesSmallStepsOutOfFloodedBatches(t *testing.T) {
	cands := []Candidate{
		{Workspace: "flood", FB: true, Tokens: 500},
		{Workspace: "light", FB: true, Tokens: 10},
		{Workspace: "mixed", FB: true, Tokens: 10},
		{Workspace: "mixed", FB: true, Tokens: 500},
		{Workspace: "busy", FB: true, Tokens: 10},
		{Workspace: "light2", FB: true, Tokens: 12},
		{Workspace: "x", FB: false},
	}
	busy := map[string]bool{"busy": true}

	// Every batch is running: the small workspaces' pieces go express.
	d := NewPlanner(1000).Plan(cands, busy, false)
	d, fast := NewPlanner(16).Express(cands, busy, d)
	require.Equal(t, []int{1}, fast, "light's step; light2's does not fit beside it (22 tokens over 16)")
	require.Equal(t, []int{6}, d.Barriers)
	require.Empty(t, d.Batch)
	require.ElementsMatch(t, []int{0, 2, 3, 4, 5}, d.Later)

	// A free batch that would hold the light step beside the flood's piece: the light step
	// goes express instead.
	cands2 := cands[:2]
	d = NewPlanner(1000).Plan(cands2, nil, true)
	require.ElementsMatch(t, []int{0, 1}, d.Batch)
	d, fast = NewPlanner(16).Express(cands2, nil, d)
	require.Equal(t, []int{1}, fast)
	require.Equal(t, []int{0}, d.Batch)
	require.Empty(t, d.Later)

	// Small steps of several workspaces alone stay one batch.
	small := []Candidate{{Workspace: "a", FB: true, Tokens: 8}, {Workspace: "b", FB: true, Tokens: 8}, {Workspace: "a", FB: true, Tokens: 8}}
	d = NewPlanner(1000).Plan(small, nil, true)
	d2, fast := NewPlanner(16).Express(small, nil, d)
	require.Empty(t, fast)
	require.Equal(t, d, d2)

	// Many small pieces of one workspace are not small work: it stays in its batch.
	many := []Candidate{{Workspace: "flood", FB: true, Tokens: 500}}
	for range 4 {
		many = append(many, Candidate{Workspace: "runs", FB: true, Tokens: 8})
	}
	d = NewPlanner(1000).Plan(many, nil, true)
	require.Len(t, d.Batch, 5)
	d2, fast = NewPlanner(16).Express(many, nil, d)
	require.Empty(t, fast, "32 tokens of one workspace in the batch: over the limit")
	require.Equal(t, d, d2)
}
