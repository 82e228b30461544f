package anthropic

import (
	"errors"
	"testing"

	"github.com/loops-dev/loops/compat/internal/infer"
)

// FuzzDecodeRequest checks the Messages decoder never panics, fails only with 4xx errors in
// Anthropic's shape, and returns only range-checked values.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"loops/tiny","max_tokens":8,"system":"s","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"top_p":0.9,"top_k":5,"stop_sequences":["\n"],"stream":true,"metadata":{"user_id":"u"}}`,
		`{"model":"tinker://run/sampler_weights/s","max_tokens":1,"system":[{"type":"text","text":"a"}],"messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":"x"}],"max_tokens":1}`,
		`{"model":"m","messages":[],"tools":[]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"u1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":"r","is_error":false},{"type":"text","text":"more"}]}],"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true},"thread":false}`,
		`{"model":1e400,"max_tokens":1.0}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="}},{"type":"text","text":"what?"}]}]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}]}`,
		`[]`, `{`, ``,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, count bool) {
		req, err := decodeRequest(b, count)
		if err != nil {
			var ae *apiError
			var ie *infer.Error
			if !errors.As(err, &ae) && !errors.As(err, &ie) {
				t.Fatalf("decoder error is not the adapter's own: %#v", err)
			}
			if status, body, id := classify(err); status < 400 || status >= 500 || body.Message == "" || body.Type == "" || id != "" {
				t.Fatalf("decoder error is not a client error in Anthropic's shape: %d %+v", status, body)
			}
			return
		}
		switch {
		case req.model == "":
			t.Fatal("a request without a model was accepted")
		case len(req.messages) == 0 || req.messages[0].Role != "user":
			t.Fatal("messages that do not start with the user's were accepted")
		case len(req.tools) > infer.MaxTools:
			t.Fatalf("%d tools accepted", len(req.tools))
		case !count && req.maxTokens < 1:
			t.Fatalf("max_tokens = %d accepted", req.maxTokens)
		case !(req.temperature >= 0 && req.temperature <= 1) || !(req.topP > 0 && req.topP <= 1) || req.topK < -1 || req.topK == 0:
			t.Fatalf("sampling params out of range accepted: %+v", req)
		case len(req.stop) > maxStopSequences:
			t.Fatalf("%d stop sequences accepted", len(req.stop))
		}
		for _, m := range req.messages {
			if m.Role != "user" && m.Role != "assistant" && (m.Role != "tool" || m.ToolCallID == "") {
				t.Fatalf("role %q accepted", m.Role)
			}
		}
	})
}
