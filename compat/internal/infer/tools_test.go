package infer

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

var weatherTools = []Tool{
	{Name: "get_weather", Description: "Weather of a city", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
	{Name: "get_time"},
}

func TestParseHermesCalls(t *testing.T) {
	for name, tc := range map[string]struct {
		text    string
		max     int
		content string
		calls   []ToolCall
	}{
		"one call": {text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			calls: []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)}}},
		"text then two calls": {text: "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
			content: "Let me check.\n\n", calls: []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)}, {Name: "get_time", Arguments: json.RawMessage(`{}`)}}},
		"arguments as a string": {text: `<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}</tool_call>`,
			calls: []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Rome"}`)}}},
		"unterminated last call": {text: "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}",
			calls: []ToolCall{{Name: "get_time", Arguments: json.RawMessage(`{}`)}}},
		"malformed JSON stays text": {text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>", content: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>"},
		"unknown tool stays text":   {text: `<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>`, content: `<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>`},
		"arguments not object":      {text: `<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>`, content: `<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>`},
		"plain text":                {text: "Sunny.", content: "Sunny."},
		"bad call then good call": {text: "<tool_call>x</tool_call><tool_call>{\"name\": \"get_time\"}</tool_call>", content: "<tool_call>x</tool_call>",
			calls: []ToolCall{{Name: "get_time", Arguments: json.RawMessage(`{}`)}}},
		"parallel off keeps the first": {text: "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"name\": \"get_time\"}</tool_call>", max: 1,
			content: "<tool_call>{\"name\": \"get_time\"}</tool_call>", calls: []ToolCall{{Name: "get_time", Arguments: json.RawMessage(`{}`)}}},
	} {
		t.Run(name, func(t *testing.T) {
			content, calls := ParseToolCalls(HermesFormat, tc.text, weatherTools, tc.max)
			require.Equal(t, tc.content, content)
			require.Equal(t, tc.calls, calls)
		})
	}
}

func TestParseLlama3Calls(t *testing.T) {
	content, calls := ParseToolCalls(Llama3Format, `<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}`, weatherTools, 0)
	require.Empty(t, content)
	require.Equal(t, []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}, {Name: "get_time", Arguments: json.RawMessage(`{}`)}}, calls)
	for _, text := range []string{`The weather is fine.`, `{"name": "get_weather", "parameters": {"city": "Oslo"}} and more`, `{"name": "nope", "parameters": {}}`, `{"name": "get_time"`} {
		content, calls := ParseToolCalls(Llama3Format, text, weatherTools, 0)
		require.Equal(t, text, content)
		require.Empty(t, calls)
	}
	// Several calls are one JSON text: over the limit, none of them is taken.
	content, calls = ParseToolCalls(Llama3Format, `{"name": "get_time"}; {"name": "get_time"}`, weatherTools, 1)
	require.Equal(t, `{"name": "get_time"}; {"name": "get_time"}`, content)
	require.Empty(t, calls)
}

func TestForcedPrefix(t *testing.T) {
	require.Equal(t, "", HermesFormat.ForcedPrefix(ToolChoice{Mode: ToolChoiceAuto}))
	require.Equal(t, "<tool_call>\n", HermesFormat.ForcedPrefix(ToolChoice{Mode: ToolChoiceRequired}))
	require.Equal(t, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":", HermesFormat.ForcedPrefix(ToolChoice{Mode: ToolChoiceFunction, Name: "get_weather"}))
	require.Equal(t, "{\"name\": \"get_time\", \"parameters\":", Llama3Format.ForcedPrefix(ToolChoice{Mode: ToolChoiceFunction, Name: "get_time"}))
	// The forced prefix and the model's continuation parse as the call.
	_, calls := ParseToolCalls(HermesFormat, HermesFormat.ForcedPrefix(ToolChoice{Mode: ToolChoiceFunction, Name: "get_weather"})+` {"city": "Lima"}}`+"\n</tool_call>", weatherTools, 0)
	require.Equal(t, []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Lima"}`)}}, calls)
	require.JSONEq(t, string(weatherTools[0].Parameters), string(ArgumentsSchema(weatherTools[0])))
	require.JSONEq(t, `{"type":"object"}`, string(ArgumentsSchema(weatherTools[1])))
}

// TestToolSplitterStreamsWhatFinishAgrees: fed in pieces of every size, the text streamed
// plus the rest Finish gives is the content ParseToolCalls finds in the whole answer, and
// no text of a call is ever streamed.
func TestToolSplitterStreamsWhatFinishAgrees(t *testing.T) {
	answers := []string{
		"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		"Plain text with a < sign and <tool and <tool_cal but no call.",
		"<tool_call>broken</tool_call> and text",
		"",
	}
	for _, a := range answers {
		for size := 1; size <= len(a)+1; size++ {
			sp := NewToolSplitter(HermesFormat, weatherTools, 0, "")
			var streamed strings.Builder
			for i := 0; i < len(a); i += size {
				streamed.WriteString(sp.Feed(a[i:min(i+size, len(a))]))
			}
			require.NotContains(t, streamed.String(), "<tool_call>{\"name\"")
			rest, calls := sp.Finish()
			content, want := ParseToolCalls(HermesFormat, a, weatherTools, 0)
			if len(want) == 0 {
				content = a
			}
			require.Equal(t, content, streamed.String()+rest, "answer %q in pieces of %d", a, size)
			require.Equal(t, want, calls)
		}
	}
	// A forced call: nothing is streamed, all of it is the call.
	sp := NewToolSplitter(HermesFormat, weatherTools, 0, "<tool_call>\n")
	require.Empty(t, sp.Feed(`{"name": "get_time"}`+"\n</tool_call>"))
	rest, calls := sp.Finish()
	require.Empty(t, rest)
	require.Len(t, calls, 1)
	// Llama 3: an answer that starts as JSON is held whole; one that does not streams.
	sp = NewToolSplitter(Llama3Format, weatherTools, 0, "")
	require.Empty(t, sp.Feed(` {"name": "get_time", `))
	require.Empty(t, sp.Feed(`"parameters": {}}`))
	rest, calls = sp.Finish()
	require.Empty(t, rest)
	require.Len(t, calls, 1)
	sp = NewToolSplitter(Llama3Format, weatherTools, 0, "")
	require.Equal(t, "Hi", sp.Feed("Hi"))
}

func TestCheckTools(t *testing.T) {
	require.NoError(t, CheckTool(weatherTools[0], json.RawMessage(`{}`), "tools[0]"))
	require.Error(t, CheckTool(Tool{Name: "bad name"}, nil, "tools[0]"))
	require.Error(t, CheckTool(Tool{Name: "f", Parameters: json.RawMessage(`[1]`)}, nil, "tools[0]"))
	deep := strings.Repeat(`{"a":`, MaxToolSchemaDepth+1) + "1" + strings.Repeat("}", MaxToolSchemaDepth+1)
	require.Error(t, CheckTool(Tool{Name: "f", Parameters: json.RawMessage(deep)}, nil, "tools[0]"))
	require.Error(t, CheckTool(Tool{Name: "f"}, make(json.RawMessage, MaxToolSchemaBytes+1), "tools[0]"))
	many := make([]Tool, MaxTools+1)
	for i := range many {
		many[i] = Tool{Name: "f" + strings.Repeat("x", i%60)}
	}
	require.Error(t, CheckTools(many, 10, "tools"))
	require.Error(t, CheckTools(weatherTools, MaxToolsBytes+1, "tools"))
	require.Error(t, CheckTools([]Tool{{Name: "f"}, {Name: "f"}}, 10, "tools"))
	require.Error(t, CheckChoice(ToolChoice{Mode: ToolChoiceFunction, Name: "g"}, weatherTools, "tool_choice"))
	require.Error(t, CheckChoice(ToolChoice{Mode: ToolChoiceRequired}, nil, "tool_choice"))
	require.NoError(t, CheckChoice(ToolChoice{Mode: ToolChoiceFunction, Name: "get_time"}, weatherTools, "tool_choice"))
}

// TestRenderToolsAsTransformers: tools and tool calls reach the template as transformers
// gives them, and tojson writes them as Python's json.dumps (", " and ": ", the client's key
// order, non-ASCII kept, floats as repr).
func TestRenderToolsAsTransformers(t *testing.T) {
	tx := tinyText(t)
	require.Equal(t, HermesFormat, tx.ToolFormat())
	tools := []Tool{{Name: "get_weather", Description: "Wetter \"jetzt\" — ü", Parameters: json.RawMessage(`{"type":"object","required":["city"],"properties":{"city":{"type":"string"},"n":{"minimum":0.5,"maximum":1e20}}}`)}}
	out, err := tx.Render([]Message{{Role: "user", Content: "Hi"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "get_weather", Arguments: json.RawMessage(`{"zeta":1,"alpha":"ä\n"}`)}}},
		{Role: "tool", Content: "sunny", ToolCallID: "c1", Name: "get_weather"}}, tools)
	require.NoError(t, err)
	require.Contains(t, out, `{"type": "function", "function": {"name": "get_weather", "description": "Wetter \"jetzt\" — ü", "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}, "n": {"minimum": 0.5, "maximum": 1e+20}}}}}`)
	require.Contains(t, out, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"zeta\": 1, \"alpha\": \"ä\\n\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
	// Without tools the template renders what it always did.
	plain, err := tx.Render([]Message{{Role: "user", Content: "Hi"}}, nil)
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", plain)
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{1: "1.0", 0.5: "0.5", 1e20: "1e+20", 1e-5: "1e-05", 123456789012345678: "1.2345678901234568e+17", -2.25: "-2.25", 1e15: "1000000000000000.0"} {
		require.Equal(t, want, pyFloat(f), "%v", f)
	}
}

// FuzzParseToolCalls: whatever the model writes, parsing never fails or panics, every call
// names an offered tool with an object of arguments, and an answer with no call comes back
// whole.
func FuzzParseToolCalls(f *testing.F) {
	for _, s := range []string{
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		"<tool_call><tool_call>{\"name\":\"get_time\"}</tool_call></tool_call>",
		"{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": 1}}",
		"<|python_tag|>{\"name\": \"get_time\"}",
		"<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"a\\\":1}\"}",
		"text <tool_call> {\"name\": ",
	} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
	}
	f.Fuzz(func(t *testing.T, text string, max uint8) {
		for _, format := range []ToolFormat{HermesFormat, Llama3Format, NoToolFormat} {
			content, calls := ParseToolCalls(format, text, weatherTools, int(max%3))
			if len(calls) == 0 && content != text {
				t.Fatalf("%v: no call, but the text changed: %q → %q", format, text, content)
			}
			if m := int(max % 3); m > 0 && len(calls) > m {
				t.Fatalf("%d calls over the limit %d", len(calls), m)
			}
			for _, c := range calls {
				var obj map[string]json.RawMessage
				if c.Name != "get_weather" && c.Name != "get_time" || json.Unmarshal(c.Arguments, &obj) != nil || obj == nil {
					t.Fatalf("bad call %+v from %q", c, text)
				}
			}
			sp := NewToolSplitter(format, weatherTools, int(max%3), "")
			half := len(text) / 2
			streamed := sp.Feed(text[:half]) + sp.Feed(text[half:])
			rest, _ := sp.Finish()
			if len(calls) == 0 && streamed+rest != text {
				t.Fatalf("%v: streamed %q + %q, want %q", format, streamed, rest, text)
			}
		}
	})
}

// promptSampling is fakeSampling that records the prompts it is asked to sample.
type promptSampling struct {
	fakeSampling
	prompts [][]int32
}

func (f *promptSampling) SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	f.prompts = append(f.prompts, req.GetPrompt())
	return f.fakeSampling.SampleStream(ctx, req, sink)
}

// TestForcedToolChoiceThroughTheEngine: a named tool choice renders the tools, appends the
// call's opening and name to the prompt, and the completion carries that prefix, so the
// model's continuation parses as the call; tool choice none renders no tools; a prefill
// and a forced call together are refused.
func TestForcedToolChoiceThroughTheEngine(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx := tinyText(t)
	f := &promptSampling{fakeSampling: fakeSampling{seqs: []*loopsv1.SampledSequence{{
		Tokens: tx.Encode(` {"city": "Paris"}}` + "\n</tool_call>"), StopReason: loopsv1.StopReason_STOP_REASON_STOP}}}}
	for _, s := range f.seqs {
		s.Logprobs = make([]float32, len(s.Tokens))
	}
	e := New(Services{Sampling: f, Models: fakeModels{dir: dir}}, Options{})
	msgs := []Message{{Role: "user", Content: "Weather in Paris?"}}
	choice := ToolChoice{Mode: ToolChoiceFunction, Name: "get_weather"}
	c, err := e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: msgs, Tools: weatherTools, ToolChoice: choice, N: 1, Params: &loopsv1.SamplingParams{}})
	require.NoError(t, err)
	rendered, err := tx.Render(msgs, weatherTools)
	require.NoError(t, err)
	require.Equal(t, tx.Encode(rendered+"<tool_call>\n{\"name\": \"get_weather\", \"arguments\":"), f.prompts[0])
	require.Equal(t, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":", c.Forced)
	content, calls := ParseToolCalls(tx.ToolFormat(), c.Forced+c.ChoiceText(0), weatherTools, 0)
	require.Empty(t, content)
	require.Equal(t, []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)}}, calls)

	// Without tools (tool_choice none: the adapters pass none) nothing is rendered or forced.
	c, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: msgs, N: 1, Params: &loopsv1.SamplingParams{}})
	require.NoError(t, err)
	plain, _ := tx.Render(msgs, nil)
	require.Equal(t, tx.Encode(plain), f.prompts[1])
	require.Empty(t, c.Forced)

	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: msgs, Prefill: "Sure", Tools: weatherTools, ToolChoice: choice, N: 1, Params: &loopsv1.SamplingParams{}})
	var ae *Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "tool_choice", ae.Param)
}

// TestToolsNeedATemplateThatRendersThem: a model whose template renders no tools refuses a
// request that offers some (rather than drop them silently).
func TestToolsNeedATemplateThatRendersThem(t *testing.T) {
	tx := tinyText(t)
	tx.tools = NoToolFormat
	_, _, err := prompts(tx, &loopsv1.ModelInfo{Name: "m"}, &Request{Messages: []Message{{Role: "user", Content: "x"}}, Tools: weatherTools})
	var ae *Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "tools", ae.Param)
	_, _, err = prompts(tx, &loopsv1.ModelInfo{Name: "m"}, &Request{Messages: []Message{{Role: "user", Content: "x"}}})
	require.NoError(t, err)
}

// TestStrictToolsTakeOnlyValidCalls: a strict tool's call whose arguments do not validate
// against its schema stays text (so every call returned validates); a non-strict tool's
// call is taken as written; a strict schema that refers outside itself is refused.
func TestStrictToolsTakeOnlyValidCalls(t *testing.T) {
	strict := []Tool{weatherTools[0], weatherTools[1]}
	require.NoError(t, strict[0].CompileStrict("tools[0].function.parameters"))
	for name, tc := range map[string]struct {
		text  string
		tools []Tool
		calls int
	}{
		"valid":                 {`<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`, strict, 1},
		"missing required":      {`<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>`, strict, 0},
		"wrong type":            {`<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>`, strict, 0},
		"not strict: as is":     {`<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>`, weatherTools, 1},
		"no schema: any object": {`<tool_call>{"name": "get_time", "arguments": {"x": 1}}</tool_call>`, strict, 1},
	} {
		t.Run(name, func(t *testing.T) {
			content, calls := ParseToolCalls(HermesFormat, tc.text, tc.tools, 0)
			require.Len(t, calls, tc.calls)
			if tc.calls == 0 {
				require.Equal(t, tc.text, content)
			}
		})
	}
	for _, schema := range []string{
		`{"$ref": "file:///etc/passwd"}`,
		`{"$ref": "https://example.com/s.json"}`,
		`{"type": 7}`,
	} {
		tool := Tool{Name: "f", Parameters: json.RawMessage(schema)}
		err := tool.CompileStrict("tools[0].function.parameters")
		require.Error(t, err, schema)
		require.Contains(t, err.Error(), "tools[0].function.parameters")
	}
}
