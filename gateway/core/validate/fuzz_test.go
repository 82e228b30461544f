package validate

import (
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzForwardBackward: any request (its wire form) is accepted or refused with
// InvalidArgument, never a panic; an accepted one is within the limits and its token count
// is its datums' tokens.
func FuzzForwardBackward(f *testing.F) {
	for _, req := range []*loopsv1.ForwardBackwardRequest{
		{LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(3), ceDatum(5)}},
		{LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 0.8}, Data: []*loopsv1.Datum{rlDatum(4)}},
		{LossFn: "gspo", LossFnConfig: map[string]float64{"clip_high_threshold": 1.5}, Data: []*loopsv1.Datum{gspoDatum(4)}},
		{LossFn: "stable_reinforce", Data: []*loopsv1.Datum{rlDatum(2)}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &loopsv1.ForwardBackwardRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		n, err := ForwardBackward(model, req, limits)
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("refused with %v, not InvalidArgument", err)
			}
			return
		}
		sum := 0
		for _, d := range req.GetData() {
			if len(d.GetTokens()) == 0 || len(d.GetTokens()) > int(model.GetMaxSequenceLength()) {
				t.Fatalf("accepted a datum of %d tokens", len(d.GetTokens()))
			}
			sum += len(d.GetTokens())
		}
		if n != sum || n > limits.MaxBatchTokens || len(req.GetData()) > limits.MaxDatums {
			t.Fatalf("accepted %d datums, %d tokens (counted %d)", len(req.GetData()), sum, n)
		}
	})
}

// FuzzSample: any sampling request is accepted or refused with InvalidArgument, never a
// panic; accepted parameters fit the model's sequence length and have top_p in (0, 1] (an
// embedding's are empty: it samples nothing).
func FuzzSample(f *testing.F) {
	for _, req := range []*loopsv1.SampleRequest{
		{Prompt: ints(4)},
		{Prompt: ints(3), NumSamples: 2, Params: &loopsv1.SamplingParams{Temperature: 0.7, TopP: 0.9, MaxTokens: 5, StopTokens: []int32{3}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &loopsv1.SampleRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		p, err := Sample(model, req, 8)
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("refused with %v, not InvalidArgument", err)
			}
			return
		}
		if req.GetEmbed() { // an embedding samples nothing: no parameters
			if !proto.Equal(p, &loopsv1.SamplingParams{}) {
				t.Fatalf("accepted an embedding with sampling parameters %v", p)
			}
			return
		}
		if len(req.GetPrompt())+int(p.GetMaxTokens()) > int(model.GetMaxSequenceLength()) || p.GetMaxTokens() < 0 {
			t.Fatalf("accepted a prompt of %d tokens with max_tokens %d", len(req.GetPrompt()), p.GetMaxTokens())
		}
		if !(p.GetTopP() > 0 && p.GetTopP() <= 1) || !(p.GetTemperature() >= 0) {
			t.Fatalf("accepted top_p %v, temperature %v", p.GetTopP(), p.GetTemperature())
		}
	})
}
