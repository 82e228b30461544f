package openai

import (
	"errors"
	"testing"

	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/internal/semantics"
)

// FuzzDecodeRequest checks the chat and completion decoders never panic, fail only with
// 4xx errors in OpenAI's shape, and return only range-checked values.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"loops/tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":5,"seed":-3,"stop":["\n"],"n":2,"logprobs":true,"top_logprobs":0,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"tinker://run/sampler_weights/s","messages":[{"role":"system","content":[{"type":"text","text":"a"}]}],"max_completion_tokens":1}`,
		`{"model":"loops/tiny","prompt":[1,2,3],"max_tokens":2,"logprobs":0,"echo":false,"best_of":1,"suffix":null}`,
		`{"model":"loops/tiny","prompt":["x"],"stop":"y","user":"u","frequency_penalty":0,"logit_bias":{}}`,
		`{"model":"m","messages":[],"tools":[]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":-2,"frequency_penalty":1.5,"min_p":0.1,"logit_bias":{"3":-100,"7":2.5},"response_format":{"type":"json_object"}}`,
		`{"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":{"type":"object","properties":{"a":{"anyOf":[{"type":"integer"},{"$ref":"#"}]}},"required":["a"]}}}}`,
		`{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"r"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,"response_format":{"type":"text"},"store":false,"service_tier":"auto","metadata":{"a":"b"}}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`,
		`{"model":1e400,"n":1.0}`,
		`{"model":"m","prompt":["a",[1,2]],"n":3}`,
		`{"model":"loops/tiny","prompt":[[1,2,3],[4,5]],"max_tokens":0,"logprobs":1,"echo":true,"temperature":0,"seed":1234}`,
		`{"model":"m","prompt":"x","max_tokens":1,"logprobs":5,"echo":true,"stream":false}`,
		`{"model":"m","prompt":"x","max_tokens":0,"echo":false}`,
		`{"model":"m","prompt":"x","echo":true,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII=","detail":"auto"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`,
		`[]`, `{`, ``,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, chat bool) {
		req, err := decodeRequest(b, chat, semantics.MaxNumSamples)
		if err != nil {
			var ae *apiError
			var ie *infer.Error
			if !errors.As(err, &ae) && !errors.As(err, &ie) {
				t.Fatalf("decoder error is not the adapter's own: %#v", err)
			}
			if status, body, id := classify(err); status < 400 || status >= 500 || body.Message == "" || body.Type == "" || id != "" {
				t.Fatalf("decoder error is not a client error in OpenAI's shape: %d %+v %#v", status, body, err)
			}
			return
		}
		switch {
		case req.model == "":
			t.Fatal("a request without a model was accepted")
		case req.n < 1 || req.n > semantics.MaxNumSamples:
			t.Fatalf("n = %d accepted", req.n)
		case req.maxTokens < 0:
			t.Fatalf("max_tokens = %d accepted", req.maxTokens)
		case !(req.temperature >= 0) || !(req.topP > 0 && req.topP <= 1) || req.topK < -1 || req.topK == 0:
			t.Fatalf("sampling params out of range accepted: %+v", req)
		case len(req.stop) > maxStop:
			t.Fatalf("%d stop sequences accepted", len(req.stop))
		case chat && len(req.messages) == 0, !chat && len(req.prompts) == 0:
			t.Fatal("a request without a prompt was accepted")
		case len(req.prompts)*int(req.n) > semantics.MaxNumSamples:
			t.Fatalf("%d prompts × n = %d accepted", len(req.prompts), req.n)
		case req.responseFormat != nil && len(req.stop) > 0:
			t.Fatal("stop with a response_format accepted")
		case req.echo && (chat || req.stream):
			t.Fatalf("echo accepted with chat %v, stream %v", chat, req.stream)
		case req.scoreOnly && (!req.echo || req.maxTokens != 0):
			t.Fatalf("max_tokens %d accepted with echo %v (score only %v)", req.maxTokens, req.echo, req.scoreOnly)
		case req.scoreOnly && req.infer().Params.GetMaxTokens() != 1:
			t.Fatal("max_tokens 0 does not sample the one token that is dropped")
		case req.echo && req.logprobs != req.infer().ScorePrompts:
			t.Fatal("echo with logprobs does not score the prompts")
		case len(req.tools) > infer.MaxTools:
			t.Fatalf("%d tools accepted", len(req.tools))
		case infer.CheckChoice(req.toolChoice, req.tools, "tool_choice") != nil:
			t.Fatalf("tool_choice %+v accepted with tools %+v", req.toolChoice, req.tools)
		}
		if err := semantics.CheckAdjustments(req.infer().Params, 0); err != nil {
			t.Fatalf("out-of-range adjustments accepted: %v", err)
		}
		for _, m := range req.messages {
			if m.Role == "developer" || (m.Role == "tool" && m.ToolCallID == "") {
				t.Fatalf("message %+v accepted as is", m)
			}
		}
		for _, p := range req.prompts {
			if p.text == "" && len(p.tokens) == 0 {
				t.Fatal("an empty prompt was accepted")
			}
			for _, tok := range p.tokens {
				if tok < 0 {
					t.Fatalf("token %d accepted", tok)
				}
			}
		}
	})
}

// FuzzDecodeEmbeddingRequest checks the POST /embeddings decoder never panics, fails only
// with 4xx errors in OpenAI's shape, and returns only range-checked values.
func FuzzDecodeEmbeddingRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"loops/tiny","input":"hello","encoding_format":"float"}`,
		`{"model":"loops/tiny","input":["a","b"],"encoding_format":"base64","dimensions":64,"user":"u"}`,
		`{"model":"tinker://run/sampler_weights/s","input":[1,2,3]}`,
		`{"model":"m","input":[[1,2],[3]],"encoding_format":null,"dimensions":null}`,
		`{"model":"m","input":[],"dimensions":0}`, `{"model":"m","input":[""]}`, `{"model":"m","input":[[]]}`,
		`{"model":"m","input":[1.5]}`, `{"model":"m","input":{"a":1}}`, `{"model":"m","input":"x","encoding_format":"hex"}`,
		`{"input":"x"}`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeEmbeddingRequest(b)
		if err != nil {
			var ae *apiError
			var ie *infer.Error
			if !errors.As(err, &ae) && !errors.As(err, &ie) {
				t.Fatalf("decoder error is not the adapter's own: %#v", err)
			}
			if status, body, id := classify(err); status < 400 || status >= 500 || body.Message == "" || body.Type == "" || id != "" {
				t.Fatalf("decoder error is not a client error in OpenAI's shape: %d %+v %#v", status, body, err)
			}
			return
		}
		switch {
		case req.model == "":
			t.Fatal("a request without a model was accepted")
		case len(req.inputs) == 0:
			t.Fatal("a request without input was accepted")
		case req.dimensions < 0:
			t.Fatalf("dimensions = %d accepted", req.dimensions)
		}
		for i, p := range req.inputs {
			if p.hasTokens && len(p.tokens) == 0 || !p.hasTokens && p.text == "" {
				t.Fatalf("input %d is empty and was accepted", i)
			}
			for _, tok := range p.tokens {
				if tok < 0 {
					t.Fatalf("input %d has a negative token id", i)
				}
			}
		}
	})
}
