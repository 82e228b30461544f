package reference

import (
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/internal/tokenstream"
)

// TestSampleStreamTokensAreTheResult: SampleStream passes every token, in order per
// sequence, as it is sampled, and returns the same bits as Sample, for requests decoded
// together in one batch.
func TestSampleStreamTokensAreTheResult(t *testing.T) {
	e := engine(t)
	reqs := batchRequests(t)
	want := sampleAll(t, e, reqs)
	bufs := make([]*tokenstream.Buffer, len(reqs))
	got := make([][]byte, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		bufs[i] = tokenstream.NewBuffer(1 << 20)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.SampleStream(ctx, r, bufs[i])
			if !assertNoErr(t, err) {
				return
			}
			got[i], err = proto.MarshalOptions{Deterministic: true}.Marshal(resp.Result)
			assertNoErr(t, err)
		}()
	}
	wg.Wait()
	for i, r := range reqs {
		require.Equal(t, want[i], got[i], "request %d: streaming changes nothing in the result", i)
		resp, err := e.Sample(ctx, r)
		require.NoError(t, err)
		perSeq := make([][]int32, len(resp.Result.Sequences))
		perLP := make([][]float32, len(resp.Result.Sequences))
		for _, tok := range bufs[i].Take() {
			perSeq[tok.Seq] = append(perSeq[tok.Seq], tok.ID)
			perLP[tok.Seq] = append(perLP[tok.Seq], tok.Logprob)
		}
		for j, seq := range resp.Result.Sequences {
			require.Equal(t, seq.Tokens, perSeq[j], "request %d sequence %d", i, j)
			require.Equal(t, seq.Logprobs, perLP[j], "request %d sequence %d", i, j)
		}
	}
}

// goneAfter is a sink whose reader leaves after n tokens.
type goneAfter struct {
	*tokenstream.Buffer
	n, seen int
}

func (g *goneAfter) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	g.Buffer.Token(seq, id, lp, top)
	if g.seen++; g.seen == g.n {
		g.Close()
	}
}

// TestSampleStreamStopsWhenGone: once the reader is gone the engine drops the sample at
// the next step boundary (Canceled), without decoding it to max_tokens.
func TestSampleStreamStopsWhenGone(t *testing.T) {
	e := engine(t)
	r := batchRequests(t)[0] // 24 tokens, no stop
	sink := &goneAfter{Buffer: tokenstream.NewBuffer(1 << 20), n: 3}
	_, err := e.SampleStream(ctx, r, sink)
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(err), "%v", err)
	require.Equal(t, 3, sink.seen, "the sample ends at the step its reader left")
}
