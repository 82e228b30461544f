package backendtest

import (
	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/conformance/oracle"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// itemCode runs a one-item ForwardBackward that must fail and returns the item's code.
// A backend may also fail the whole request; its code counts then.
func (h *harness) itemCode(it *backendv1.ForwardBackwardItem) connect.Code {
	h.t.Helper()
	resp, err := h.tr.ForwardBackward(h.ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{it}})
	if err != nil {
		return code(err)
	}
	require.Len(h.t, resp.GetResults(), 1)
	e := resp.GetResults()[0].GetError()
	require.NotNil(h.t, e, "the item succeeded; want an error")
	require.NotEmpty(h.t, e.GetMessage(), "item errors say what was wrong")
	return connect.Code(e.GetCode())
}

func errorCases() []testCase {
	ce := oracle.Loss{Name: "cross_entropy"}
	bad := func(name string, mutate func(h *harness, it *backendv1.ForwardBackwardItem)) testCase {
		return testCase{"errors/" + name, func(h *harness) {
			id := h.create(loraConfig())
			it := item(id, ce, []example{h.ceExample(5, nil)}, false)
			mutate(h, it)
			require.Equal(h.t, connect.CodeInvalidArgument, h.itemCode(it))
		}}
	}
	return []testCase{
		{"errors/unknown_adapter", func(h *harness) {
			missing := "bt-no-such-adapter"
			require.Equal(h.t, connect.CodeNotFound, h.itemCode(item(missing, ce, []example{h.ceExample(4, nil)}, false)), "ForwardBackward")
			_, err := h.tr.OptimStep(h.ctx, &backendv1.OptimStepRequest{AdapterId: missing, Adam: adam(defaultAdam(1e-3))})
			require.Equal(h.t, connect.CodeNotFound, code(err), "OptimStep: %v", err)
			_, err = h.tr.SaveAdapter(h.ctx, &backendv1.SaveAdapterRequest{AdapterId: missing, Dir: h.dir("missing")})
			require.Equal(h.t, connect.CodeNotFound, code(err), "SaveAdapter: %v", err)
		}},
		bad("out_of_vocab/input", func(h *harness, it *backendv1.ForwardBackwardItem) {
			it.Data[0].Tokens[2] = int32(h.o.Cfg.VocabSize)
		}),
		bad("out_of_vocab/negative", func(h *harness, it *backendv1.ForwardBackwardItem) {
			it.Data[0].Tokens[0] = -1
		}),
		bad("out_of_vocab/target", func(h *harness, it *backendv1.ForwardBackwardItem) {
			it.Data[0].LossFnInputs["target_tokens"].Int64Data[1] = int64(h.o.Cfg.VocabSize)
		}),
		bad("too_long", func(h *harness, it *backendv1.ForwardBackwardItem) {
			n := int(h.caps().GetMaxSequenceLength()) + 1
			ex := h.ceExample(n, nil)
			it.Data[0] = ex.proto
		}),
		bad("length_mismatch", func(h *harness, it *backendv1.ForwardBackwardItem) {
			w := it.Data[0].LossFnInputs["weights"]
			w.Float32Data = w.Float32Data[:len(w.Float32Data)-1]
			w.Shape = []int64{int64(len(w.Float32Data))}
		}),
		bad("empty_batch", func(_ *harness, it *backendv1.ForwardBackwardItem) {
			it.Data = nil
		}),
		bad("unknown_loss", func(_ *harness, it *backendv1.ForwardBackwardItem) {
			it.LossFn = "no_such_loss"
		}),
		bad("missing_loss_input", func(_ *harness, it *backendv1.ForwardBackwardItem) {
			delete(it.Data[0].LossFnInputs, "weights")
		}),
		{"errors/empty_request", func(h *harness) {
			_, err := h.tr.ForwardBackward(h.ctx, &backendv1.ForwardBackwardRequest{})
			require.Equal(h.t, connect.CodeInvalidArgument, code(err), "%v", err)
		}},
		{"errors/item_isolation", func(h *harness) {
			// a bad item fails alone; the others of the request succeed
			id := h.create(loraConfig())
			good := []example{h.ceExample(5, nil)}
			resp, err := h.tr.ForwardBackward(h.ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
				item(id, oracle.Loss{Name: "no_such_loss"}, good, false), item(id, ce, good, true)}})
			require.NoError(h.t, err)
			require.Len(h.t, resp.GetResults(), 2)
			require.Equal(h.t, int32(connect.CodeInvalidArgument), resp.GetResults()[0].GetError().GetCode())
			require.NotNil(h.t, resp.GetResults()[1].GetResult(), "the good item failed: %v", resp.GetResults()[1].GetError())
			h.checkOutputs(resp.GetResults()[1].GetResult(), good, h.o.Evaluate(nil, ce, oracleData(good)))
		}},
		{"errors/rank", func(h *harness) {
			maxRank := h.caps().GetMaxLoraRank()
			for _, r := range []int32{-1, maxRank + 1} {
				lc := loraConfig()
				lc.Rank = r
				_, err := h.tr.CreateAdapter(h.ctx, &backendv1.CreateAdapterRequest{AdapterId: "bt-bad-rank", BaseModel: h.opts.ModelName, Lora: lc})
				require.Equal(h.t, connect.CodeInvalidArgument, code(err), "rank %d: %v", r, err)
			}
			// rank 0 is full fine-tuning: a backend that does not say it serves it refuses it
			// as a precondition (the model's backend), never as bad input
			if !h.caps().GetFullFinetune() {
				lc := loraConfig()
				lc.Rank = 0
				_, err := h.tr.CreateAdapter(h.ctx, &backendv1.CreateAdapterRequest{AdapterId: "bt-bad-rank", BaseModel: h.opts.ModelName, Lora: lc})
				require.Equal(h.t, connect.CodeFailedPrecondition, code(err), "rank 0: %v", err)
			}
		}},
		{"errors/sample", func(h *harness) {
			maxLen := int(h.caps().GetMaxSequenceLength())
			cases := map[string]*backendv1.SampleRequest{
				"out-of-vocab prompt": {Prompt: []int32{1, int32(h.o.Cfg.VocabSize)}, NumSamples: 1, Params: params(2, 1, 1)},
				"empty prompt":        {NumSamples: 1, Params: params(2, 1, 1)},
				"too long":            {Prompt: toInt32(h.tokens(4)), NumSamples: 1, Params: params(maxLen, 1, 1)},
				"zero max_tokens":     {Prompt: toInt32(h.tokens(4)), NumSamples: 1, Params: params(0, 1, 1)},
				"negative temp":       {Prompt: toInt32(h.tokens(4)), NumSamples: 1, Params: params(2, -1, 1)},
			}
			for what, req := range cases {
				req.BaseModel = h.opts.ModelName
				_, err := h.sp.Sample(h.ctx, req)
				require.Equal(h.t, connect.CodeInvalidArgument, code(err), "%s: %v", what, err)
			}
		}},
		{"errors/unknown_model", func(h *harness) {
			_, err := h.tr.CreateAdapter(h.ctx, &backendv1.CreateAdapterRequest{AdapterId: "bt-bad-model", BaseModel: "no/such-model", Lora: loraConfig()})
			require.Contains(h.t, []connect.Code{connect.CodeInvalidArgument, connect.CodeNotFound}, code(err), "CreateAdapter: %v", err)
			_, err = h.sp.Sample(h.ctx, &backendv1.SampleRequest{BaseModel: "no/such-model", Prompt: []int32{1}, NumSamples: 1, Params: params(1, 1, 1)})
			require.Contains(h.t, []connect.Code{connect.CodeInvalidArgument, connect.CodeNotFound}, code(err), "Sample: %v", err)
		}},
	}
}
