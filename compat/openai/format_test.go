package openai_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
)

// jsonSchema is a response_format of type json_schema.
func jsonSchema(schema any) map[string]any {
	return map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "answer", "strict": true, "schema": schema}}
}

// TestStructuredOutputs asks the tiny model for JSON through response_format, plain and
// streamed, on chat and completions: every choice that finishes with "stop" parses and
// validates against the schema, and the stream carries the same text.
func TestStructuredOutputs(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"city":  map[string]any{"type": "string"},
			"sunny": map[string]any{"type": "boolean"},
			"temp":  map[string]any{"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "null"}}},
			"kind":  map[string]any{"enum": []any{"rain", "snow"}},
		},
		"required":             []string{"city", "sunny", "temp", "kind"},
		"additionalProperties": false,
	}
	raw, err := json.Marshal(schema)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("s.json", doc))
	sch, err := c.Compile("s.json")
	require.NoError(t, err)
	valid := func(text string) {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
		require.NoError(t, err, text)
		require.NoError(t, sch.Validate(inst), text)
	}

	body := chatBody("The weather?", map[string]any{"response_format": jsonSchema(schema), "n": 4, "seed": 3, "max_tokens": 300, "temperature": 1})
	res := okFn(t)(call(t, "POST", url+"/chat/completions", keyA, body))
	stopped := 0
	for _, ch := range res.Choices {
		if ch.FinishReason == "stop" {
			stopped++
			valid(ch.Message.Content)
		}
	}
	require.Positive(t, stopped)

	// streamed: the same text, chunk by chunk
	body["stream"] = true
	chunks := stream(t, url+"/chat/completions", body)
	texts := make([]strings.Builder, 4)
	finish := make([]string, 4)
	for _, c := range chunks {
		for _, ch := range c["choices"].([]any) {
			ch := ch.(map[string]any)
			i := int(ch["index"].(float64))
			if d, ok := ch["delta"].(map[string]any)["content"].(string); ok {
				texts[i].WriteString(d)
			}
			if fr, ok := ch["finish_reason"].(string); ok {
				finish[i] = fr
			}
		}
	}
	for i, ch := range res.Choices {
		require.Equal(t, ch.Message.Content, texts[i].String())
		require.Equal(t, ch.FinishReason, finish[i])
	}

	// json_object on completions; a short max_tokens ends with "length" (the JSON is then
	// incomplete, as documented)
	res = okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "JSON:", "n": 3, "seed": 5, "max_tokens": 300,
		"response_format": map[string]any{"type": "json_object"}}))
	for _, ch := range res.Choices {
		if ch.FinishReason == "stop" {
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(ch.Text), &v), ch.Text)
		}
	}
	res = okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "JSON:", "max_tokens": 2,
		"response_format": map[string]any{"type": "json_object"}}))
	require.Equal(t, "length", res.Choices[0].FinishReason)
	require.True(t, strings.HasPrefix(res.Choices[0].Text, "{"), res.Choices[0].Text)

	// an unsupported keyword is a 400 naming it and where it is
	status, raw400 := call(t, "POST", url+"/chat/completions", keyA, chatBody("x", map[string]any{"response_format": jsonSchema(map[string]any{
		"type": "object", "properties": map[string]any{"zip": map[string]any{"type": "string", "pattern": "^[0-9]+$"}}, "required": []string{"zip"}})}))
	require.Equal(t, 400, status)
	require.Contains(t, string(raw400), `keyword \"pattern\"`)
	require.Contains(t, string(raw400), `#/properties/zip`)

	// the neutral format and values are accepted
	okFn(t)(call(t, "POST", url+"/chat/completions", keyA, chatBody("x", map[string]any{"response_format": map[string]any{"type": "text"}, "max_tokens": 2,
		"logit_bias": map[string]any{}, "presence_penalty": 0, "frequency_penalty": 0, "min_p": 0})))
}

// TestLogitBiasOnTheRoute checks that logit_bias reaches the sampler: +100 on one token
// makes every token that one.
func TestLogitBiasOnTheRoute(t *testing.T) {
	url := startServer(t, nil) + "/oai/api/v1"
	res := okFn(t)(call(t, "POST", url+"/completions", keyA, map[string]any{"model": tiny.Name, "prompt": "Hi", "max_tokens": 5, "seed": 1,
		"logit_bias": map[string]any{"72": 100}, "presence_penalty": 0.5, "frequency_penalty": 0.5, "min_p": 0.1}))
	want := tiny.Tokenizer().Decode([]int{72})
	require.Equal(t, strings.Repeat(want, 5), res.Choices[0].Text)
}
