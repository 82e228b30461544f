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
