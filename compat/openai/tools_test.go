package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/internal/semantics"
)

// TestDecodeToolConversation: the developer role is system, assistant tool_calls keep their
// arguments as the JSON object they hold, tool messages are named after the call they
// answer, and the tool fields and neutral values are read.
func TestDecodeToolConversation(t *testing.T) {
	body := `{"model": "m", "messages": [
	    {"role": "developer", "content": "Be brief."},
	    {"role": "user", "content": "Weather?"},
	    {"role": "assistant", "content": null, "refusal": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
	    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}],
	  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}, "strict": true}}],
	  "tool_choice": "required", "parallel_tool_calls": false, "response_format": {"type": "text"}, "store": false,
	  "service_tier": "auto", "metadata": {"k": "v"}, "prompt_cache_key": "p", "safety_identifier": "s", "modalities": ["text"]}`
	req, err := decodeRequest([]byte(body), true, semantics.MaxNumSamples)
	require.NoError(t, err)
	require.Equal(t, []message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", ToolCalls: []infer.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "tool", Content: "sunny", ToolCallID: "call_1", Name: "get_weather"},
	}, req.messages)
	require.Equal(t, infer.ToolChoice{Mode: infer.ToolChoiceRequired}, req.toolChoice)
	require.True(t, req.toolsActive())
	require.Equal(t, 1, req.maxCalls())
	in := req.infer()
	require.Equal(t, req.tools, in.Tools)

	none, err := decodeRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}`), true, 1)
	require.NoError(t, err)
	require.Empty(t, none.infer().Tools, "tool_choice none offers no tools")

	for bad, param := range map[string]string{
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`: "messages[0].tool_calls[0].function.arguments",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`:                                                    "tool_choice",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"parallel_tool_calls":false}`:                                                  "parallel_tool_calls",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":{"a":1}}`:                                                           "metadata",
		`{"model":"m","prompt":"x","tools":[]}`:                                                                                                 "tools",
	} {
		_, err := decodeRequest([]byte(bad), !strings.Contains(bad, `"prompt"`), semantics.MaxNumSamples)
		require.Error(t, err, bad)
		_, eb, _ := classify(err)
		require.NotNil(t, eb.Param, bad)
		require.Equal(t, param, *eb.Param, bad)
	}
}
