package anthropic

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/compat/internal/infer"
)

// TestDecodeToolTurns: tool_use blocks are the assistant turn's calls, tool_result blocks
// become tool messages (named after the call they answer) before the user turn's text, and
// tools and tool_choice are read with their bounds.
func TestDecodeToolTurns(t *testing.T) {
	body := `{"model": "m", "max_tokens": 8, "system": "S",
	  "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
	  "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
	  "messages": [
	    {"role": "user", "content": "Weather?"},
	    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
	    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "And tomorrow?"}]},
	    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}]},
	    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain", "is_error": false}]}]}`
	req, err := decodeRequest([]byte(body), false)
	require.NoError(t, err)
	require.Equal(t, []infer.Message{
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", Content: "Let me look.", ToolCalls: []infer.ToolCall{{ID: "toolu_1", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "tool", Content: "sunny", ToolCallID: "toolu_1", Name: "get_weather"},
		{Role: "user", Content: "And tomorrow?"},
		{Role: "assistant", ToolCalls: []infer.ToolCall{{ID: "toolu_2", Name: "get_weather", Arguments: json.RawMessage(`{}`)}}},
		{Role: "tool", Content: "rain", ToolCallID: "toolu_2", Name: "get_weather"},
	}, req.messages)
	require.Equal(t, infer.ToolChoice{Mode: infer.ToolChoiceFunction, Name: "get_weather"}, req.toolChoice)
	require.False(t, req.parallel)
	require.Equal(t, 1, req.maxCalls())
	require.Len(t, req.tools, 1)
	require.Empty(t, req.prefill(), "a last turn of tool results is not a prefill")
	require.Equal(t, "system", req.conversation()[0].Role)

	for bad, where := range map[string]string{
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"x","name":"f","input":{}}]}]}`:                        "messages[0].content[0].type",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`:                                                    "tool_use_id",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool"}}`:                                           "tool_choice.name",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"maybe"}}`: "tool_choice.type",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thread":true}`:                                                           "thread",
	} {
		_, err := decodeRequest([]byte(bad), false)
		require.Error(t, err, bad)
		_, eb, _ := classify(err)
		require.Contains(t, eb.Message, where, bad)
	}
	_, err = decodeRequest([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thread":true}`), false)
	_, eb, _ := classify(err)
	require.Equal(t, "thread_unsupported_request", eb.Details["error_code"], "the rejection Anthropic's tool runner reads as: continue without a thread")
}
