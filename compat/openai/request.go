package openai

import (
	"bytes"

	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/loops-dev/loops/compat/internal/infer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

// maxStop is OpenAI's documented limit on stop sequences ("up to 4 sequences").
const maxStop = 4

// maxCompletionLogprobs is OpenAI's limit on a completion's logprobs (alternatives per
// token).
const maxCompletionLogprobs = 5

// message is one chat message.
type message = infer.Message

// prompt is one completion prompt: text, or token ids when tokens is set.
type prompt struct {
	text      string
	tokens    []int32
	hasTokens bool
}

// request is a decoded, range-checked chat or completion request. Zero values of maxTokens
// leave the default to the core (semantics.DefaultMaxTokens, capped by the model's length).
type request struct {
	chat  bool
	model string
	// messages (chat) or prompts (completions: one or several).
	messages []message
	prompts  []prompt

	maxTokens    int32
	temperature  float32
	topP         float32
	topK         int32
	seed         *uint64
	stop         []string
	n            int32
	logprobs     bool
	topLogprobs  int32
	stream       bool
	includeUsage bool
	// echo (completions): the answer's text starts with the prompt, and with logprobs its
	// logprobs cover the prompt's tokens first (scored by the same forward pass).
	echo bool
	// scoreOnly: max_tokens 0 (with echo): the prompt is scored and nothing is returned
	// after it (the core samples one token, which is dropped).
	scoreOnly bool
	// logit adjustments and structured outputs (format.go)
	logitBias        map[int32]float32
	presencePenalty  float32
	frequencyPenalty float32
	minP             float32
	responseFormat   *loopsv1.ResponseFormat

	// tools offered, the tool choice (its Mode "" when not given) and whether several calls
	// may be made in one answer (parallel_tool_calls, default true).
	tools      []infer.Tool
	toolChoice infer.ToolChoice
	parallel   bool
}

// toolsActive says whether the answer is parsed for tool calls: tools are given and
// tool_choice is not none.
func (req *request) toolsActive() bool {
	return len(req.tools) > 0 && req.toolChoice.Mode != infer.ToolChoiceNone
}

// decodeRequest decodes the body of POST /chat/completions (chat) or POST /completions.
// Every field is range-checked; a field the adapter does not implement is a 400 naming it.
// maxN caps n.
func decodeRequest(b []byte, chat bool, maxN int) (*request, error) {
	fields, err := infer.DecodeObject(b, "")
	if err != nil {
		return nil, err
	}
	req := &request{chat: chat, temperature: 1, topP: 1, topK: -1, n: 1, parallel: true}
	var hasParallel bool
	var maxTokens, maxCompletionTokens, bestOf *int64
	hasMessages, hasPrompt := false, false
	// Visit the fields in a fixed order so that the error names the same field every time.
	for _, name := range infer.SortedKeys(fields) {
		raw := fields[name]
		if infer.IsNull(raw) {
			continue // OpenAI's clients send null for "not given"
		}
		switch name {
		case "model":
			if req.model, err = infer.Str(raw, name); err != nil {
				return nil, err
			}
		case "messages":
			if !chat {
				return nil, unsupported(name, "messages belong to POST /chat/completions; send prompt here")
			}
			if req.messages, err = decodeMessages(raw); err != nil {
				return nil, err
			}
			hasMessages = true
		case "prompt":
			if chat {
				return nil, unsupported(name, "POST /chat/completions takes messages; send a prompt to POST /completions")
			}
			if req.prompts, err = decodePrompts(raw, name); err != nil {
				return nil, err
			}
			hasPrompt = true
		case "max_tokens":
			// 0 is allowed only with echo (checked below): the prompt scored, nothing sampled.
			v, err := infer.Integer(raw, name, 0, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			maxTokens = &v
		case "max_completion_tokens":
			if !chat {
				return nil, unsupported(name, "use max_tokens on POST /completions")
			}
			v, err := infer.Integer(raw, name, 1, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			maxCompletionTokens = &v
		case "temperature":
			v, err := infer.Float(raw, name, 0, math.MaxFloat32)
			if err != nil {
				return nil, err
			}
			req.temperature = float32(v)
		case "top_p":
			v, err := infer.Float(raw, name, 0, 1)
			if err != nil {
				return nil, err
			}
			if v == 0 {
				return nil, badField(name, "top_p must be in (0, 1], got 0")
			}
			req.topP = float32(v)
		case "top_k":
			v, err := infer.Integer(raw, name, -1, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			if v == 0 {
				v = -1 // 0 and -1 both mean no limit
			}
			req.topK = int32(v)
		case "seed":
			if req.seed, err = infer.Seed(raw); err != nil {
				return nil, err
			}
		case "stop":
			if req.stop, err = decodeStop(raw); err != nil {
				return nil, err
			}
		case "n":
			v, err := infer.Integer(raw, name, 1, int64(maxN))
			if err != nil {
				return nil, err
			}
			req.n = int32(v)
		case "best_of":
			if chat {
				return nil, unsupported(name, "")
			}
			v, err := infer.Integer(raw, name, 1, int64(maxN))
			if err != nil {
				return nil, err
			}
			bestOf = &v
		case "logprobs":
			if err := req.decodeLogprobs(raw, name); err != nil {
				return nil, err
			}
		case "top_logprobs":
			if !chat {
				return nil, unsupported(name, "")
			}
			v, err := infer.Integer(raw, name, 0, semantics.MaxTopLogprobs)
			if err != nil {
				return nil, err
			}
			req.topLogprobs = int32(v)
		case "stream":
			if err := json.Unmarshal(raw, &req.stream); err != nil {
				return nil, badField(name, "stream must be a boolean")
			}
		case "stream_options":
			if err := req.decodeStreamOptions(raw); err != nil {
				return nil, err
			}
		case "user":
			// An end-user id for the caller's own abuse tracking: accepted, and has no effect.
			if _, err := infer.Str(raw, name); err != nil {
				return nil, err
			}
		case "frequency_penalty", "presence_penalty":
			v, err := infer.Float(raw, name, -semantics.MaxPenalty, semantics.MaxPenalty)
			if err != nil {
				return nil, err
			}
			if name == "frequency_penalty" {
				req.frequencyPenalty = float32(v)
			} else {
				req.presencePenalty = float32(v)
			}
		case "min_p":
			v, err := infer.Float(raw, name, 0, 1)
			if err != nil {
				return nil, err
			}
			req.minP = float32(v)
		case "logit_bias":
			if req.logitBias, err = decodeLogitBias(raw); err != nil {
				return nil, err
			}
		case "response_format":
			if req.responseFormat, err = decodeResponseFormat(raw); err != nil {
				return nil, err
			}
		case "tools", "tool_choice", "parallel_tool_calls":
			if !chat {
				return nil, unsupported(name, "tools belong to POST /chat/completions")
			}
			switch name {
			case "tools":
				if req.tools, err = decodeTools(raw); err != nil {
					return nil, err
				}
			case "tool_choice":
				if req.toolChoice, err = decodeToolChoice(raw); err != nil {
					return nil, err
				}
			default:
				if err := json.Unmarshal(raw, &req.parallel); err != nil {
					return nil, badField(name, "parallel_tool_calls must be a boolean")
				}
				hasParallel = true
			}
		case "store":
			var store bool
			if json.Unmarshal(raw, &store) != nil || store {
				return nil, unsupported(name, "Loops does not store completions; omit store or send false")
			}
		case "service_tier":
			if tier, err := infer.Str(raw, name); err != nil || (tier != "auto" && tier != "default") {
				return nil, unsupported(name, `only "auto" or "default" (Loops serves every request in one tier)`)
			}
		case "metadata":
			if err := decodeMetadata(raw); err != nil {
				return nil, err
			}
		case "prompt_cache_key", "safety_identifier":
			// A caching hint and an end-user id for the caller's own tracking: accepted, and
			// have no effect.
			if _, err := infer.Str(raw, name); err != nil {
				return nil, err
			}
		case "modalities":
			var m []string
			if json.Unmarshal(raw, &m) != nil || len(m) != 1 || m[0] != "text" {
				return nil, unsupported(name, `only ["text"]`)
			}
		case "echo":
			if chat {
				return nil, unsupported(name, "echo belongs to POST /completions")
			}
			if err := json.Unmarshal(raw, &req.echo); err != nil {
				return nil, badField(name, "echo must be a boolean")
			}
		case "suffix":
			if s, err := infer.Str(raw, name); err != nil || s != "" || chat {
				return nil, unsupported(name, "")
			}
		default:
			return nil, unsupported(name, "")
		}
	}
	switch {
	case req.model == "":
		return nil, badField("model", "model is required: a base model id (GET /models), a tinker://…/sampler_weights/… path or \"<base model>;<checkpoint path>\"")
	case chat && !hasMessages:
		return nil, badField("messages", "messages is required")
	case !chat && !hasPrompt:
		return nil, badField("prompt", "prompt is required")
	case len(req.prompts)*int(req.n) > maxN:
		return nil, badField("prompt", "%d prompts × n = %d is over the server's limit of %d choices per request", len(req.prompts), req.n, maxN)
	case req.topLogprobs > 0 && !req.logprobs:
		return nil, badField("top_logprobs", "top_logprobs needs logprobs: true")
	case hasParallel && len(req.tools) == 0 && !req.parallel:
		return nil, badField("parallel_tool_calls", "parallel_tool_calls needs tools")
	case req.includeUsage && !req.stream:
		return nil, badField("stream_options", "stream_options is only allowed with stream: true")
	case bestOf != nil && *bestOf != 1 && *bestOf != int64(req.n):
		return nil, unsupported("best_of", "best_of other than 1 or n is not supported; omit it")
	case req.responseFormat != nil && len(req.stop) > 0:
		return nil, badField("stop", "stop cannot be combined with a JSON response_format (a stop sequence would cut the JSON short): leave stop out")
	case maxTokens != nil && maxCompletionTokens != nil && *maxTokens != *maxCompletionTokens:
		return nil, badField("max_completion_tokens", "give max_completion_tokens or max_tokens, not both")
	case maxTokens != nil && *maxTokens == 0 && !req.echo:
		return nil, badField("max_tokens", "max_tokens must be at least 1 (0, which samples nothing, is allowed only with echo: true)")
	case req.echo && req.stream:
		return nil, badField("echo", "echo cannot be combined with stream: true: send stream: false")
	}
	if err := infer.CheckChoice(req.toolChoice, req.tools, "tool_choice"); err != nil {
		return nil, err
	}
	if maxTokens != nil {
		req.maxTokens, req.scoreOnly = int32(*maxTokens), *maxTokens == 0
	}
	if maxCompletionTokens != nil {
		req.maxTokens = int32(*maxCompletionTokens)
	}
	return req, nil
}

func truncate(s string) string { return infer.Truncate(s) }

func decodeStop(raw json.RawMessage) ([]string, error) {
	var one string
	var many []string
	switch {
	case json.Unmarshal(raw, &one) == nil:
		many = []string{one}
	case json.Unmarshal(raw, &many) == nil:
	default:
		return nil, badField("stop", "stop must be a string or a list of strings")
	}
	if len(many) > maxStop {
		return nil, badField("stop", "stop has %d sequences; at most %d are allowed", len(many), maxStop)
	}
	for _, s := range many {
		if s == "" {
			return nil, badField("stop", "stop sequences must not be empty")
		}
	}
	if len(many) == 0 {
		return nil, nil
	}
	return many, nil
}

func (req *request) decodeLogprobs(raw json.RawMessage, name string) error {
	if req.chat {
		if err := json.Unmarshal(raw, &req.logprobs); err != nil {
			return badField(name, "logprobs must be a boolean")
		}
		return nil
	}
	// Completions: logprobs is the number of top alternatives; 0 asks for the sampled
	// tokens' logprobs only.
	v, err := infer.Integer(raw, name, 0, maxCompletionLogprobs)
	if err != nil {
		return err
	}
	req.logprobs, req.topLogprobs = true, int32(v)
	return nil
}

func (req *request) decodeStreamOptions(raw json.RawMessage) error {
	fields, err := infer.DecodeObject(raw, "stream_options")
	if err != nil {
		return err
	}
	for _, k := range infer.SortedKeys(fields) {
		v := fields[k]
		switch {
		case infer.IsNull(v):
		case k == "include_usage":
			if err := json.Unmarshal(v, &req.includeUsage); err != nil {
				return badField("stream_options.include_usage", "stream_options.include_usage must be a boolean")
			}
		default:
			return unsupported("stream_options."+k, "")
		}
	}
	return nil
}

// decodePrompts reads a completion's prompt (or an embedding request's input, name): a
// string, a list of token ids, or a list of those (several prompts, each sampled n times).
func decodePrompts(raw json.RawMessage, name string) ([]prompt, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, badField(name, "%s must not be empty", name)
		}
		return []prompt{{text: s}}, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return nil, badField(name, "%s must be a non-empty string, a list of token ids, or a list of those", name)
	}
	first := bytes.TrimSpace(list[0])
	if len(first) == 0 || (first[0] != '"' && first[0] != '[') {
		toks, err := tokenIDs(list, name)
		if err != nil {
			return nil, err
		}
		return []prompt{{tokens: toks, hasTokens: true}}, nil
	}
	out := make([]prompt, len(list))
	for i, item := range list {
		param := fmt.Sprintf("%s[%d]", name, i)
		var inner []json.RawMessage
		switch {
		case json.Unmarshal(item, &out[i].text) == nil:
			if out[i].text == "" {
				return nil, badField(param, "%s must not be empty", param)
			}
		case json.Unmarshal(item, &inner) == nil && len(inner) > 0:
			toks, err := tokenIDs(inner, param)
			if err != nil {
				return nil, err
			}
			out[i] = prompt{tokens: toks, hasTokens: true}
		default:
			return nil, badField(param, "%s must be a non-empty string or list of token ids", param)
		}
	}
	return out, nil
}

// tokenIDs reads a list of token ids; param names the list in errors.
func tokenIDs(list []json.RawMessage, param string) ([]int32, error) {
	toks := make([]int32, len(list))
	for i, t := range list {
		v, err := infer.Integer(t, fmt.Sprintf("%s[%d]", param, i), 0, math.MaxInt32)
		if err != nil {
			return nil, err
		}
		toks[i] = int32(v)
	}
	return toks, nil
}

// decodeMessages reads chat messages: role system (developer is read as system), user,
// assistant (with tool_calls) or tool (with tool_call_id), and content a string or a list
// of text parts (joined with newlines).
func decodeMessages(raw json.RawMessage) ([]message, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, badField("messages", "messages must be a list of {role, content} objects")
	}
	if len(list) == 0 {
		return nil, badField("messages", "messages must not be empty")
	}
	out := make([]message, len(list))
	callNames := map[string]string{} // tool call id → its tool, for the tool messages
	for i, m := range list {
		param := fmt.Sprintf("messages[%d]", i)
		fields, err := infer.DecodeObject(m, param)
		if err != nil {
			return nil, err
		}
		// The role first: the fields a message may carry depend on it.
		if raw, ok := fields["role"]; ok && !infer.IsNull(raw) {
			if out[i].Role, err = infer.Str(raw, param+".role"); err != nil {
				return nil, err
			}
		}
		switch out[i].Role {
		case "developer":
			out[i].Role = "system" // OpenAI's newer name for system instructions
		case "system", "user", "assistant", "tool":
		case "":
			return nil, badField(param+".role", "%s.role is required", param)
		default:
			return nil, unsupported(param+".role", fmt.Sprintf("role %q is not supported; use developer, system, user, assistant or tool", truncate(out[i].Role)))
		}
		hasContent := false
		for _, k := range infer.SortedKeys(fields) {
			v := fields[k]
			if infer.IsNull(v) {
				continue
			}
			switch {
			case k == "role":
			case k == "content":
				if out[i].Content, out[i].Parts, err = content(v, param+".content", out[i].Role == "user"); err != nil {
					return nil, err
				}
				hasContent = true
			case k == "tool_calls" && out[i].Role == "assistant":
				if out[i].ToolCalls, err = decodeToolCalls(v, param+".tool_calls"); err != nil {
					return nil, err
				}
				for _, c := range out[i].ToolCalls {
					callNames[c.ID] = c.Name
				}
			case k == "tool_call_id" && out[i].Role == "tool":
				if out[i].ToolCallID, err = infer.Str(v, param+"."+k); err != nil {
					return nil, err
				}
			case k == "refusal" && out[i].Role == "assistant":
				if s, err := infer.Str(v, param+"."+k); err != nil || s != "" {
					return nil, unsupported(param+"."+k, "only null or an empty refusal")
				}
			default:
				return nil, unsupported(param+"."+k, "messages carry role and content (assistant: tool_calls; tool: tool_call_id)")
			}
		}
		switch {
		case !hasContent && !(out[i].Role == "assistant" && len(out[i].ToolCalls) > 0):
			return nil, badField(param+".content", "%s.content is required", param)
		case out[i].Role == "tool" && out[i].ToolCallID == "":
			return nil, badField(param+".tool_call_id", "%s.tool_call_id is required: the id of the call it answers", param)
		case out[i].Role == "tool":
			name, ok := callNames[out[i].ToolCallID]
			if !ok {
				return nil, badField(param+".tool_call_id", "%s answers tool call %q, which no earlier assistant message made (a tool message follows the assistant message with its tool_calls)", param, truncate(out[i].ToolCallID))
			}
			out[i].Name = name
		}
	}
	return out, nil
}

// decodeToolCalls reads an assistant message's tool_calls: [{id, type: "function",
// function: {name, arguments: a JSON object as a string}}].
func decodeToolCalls(raw json.RawMessage, param string) ([]infer.ToolCall, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, badField(param, "%s must be a list of {id, type, function} objects", param)
	}
	out := make([]infer.ToolCall, len(list))
	for j, item := range list {
		pp := fmt.Sprintf("%s[%d]", param, j)
		var c struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function *struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if json.Unmarshal(item, &c) != nil || c.Function == nil {
			return nil, badField(pp, "%s must be {id, type: \"function\", function: {name, arguments}}", pp)
		}
		if c.Type != "function" && c.Type != "" {
			return nil, unsupported(pp+".type", "only function tool calls")
		}
		args := json.RawMessage(c.Function.Arguments)
		if strings.TrimSpace(c.Function.Arguments) == "" {
			args = json.RawMessage("{}")
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(args, &obj) != nil || obj == nil {
			return nil, badField(pp+".function.arguments", "%s.function.arguments must be a JSON object, as a string", pp)
		}
		out[j] = infer.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args}
	}
	return out, nil
}

// decodeTools reads tools: [{type: "function", function: {name, description, parameters,
// strict}}], bounded (infer.CheckTools). strict is accepted but not enforced: the
// arguments are sampled freely (docs/openai.md).
func decodeTools(raw json.RawMessage) ([]infer.Tool, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, badField("tools", "tools must be a list of {type: \"function\", function: {...}} objects")
	}
	out := make([]infer.Tool, len(list))
	for i, item := range list {
		param := fmt.Sprintf("tools[%d]", i)
		fields, err := infer.DecodeObject(item, param)
		if err != nil {
			return nil, err
		}
		// The type first: it says best what is wrong with another kind of tool.
		if t, err := infer.Str(fields["type"], param+".type"); err != nil || t != "function" {
			return nil, unsupported(param+".type", "only function tools ({\"type\": \"function\", \"function\": {...}})")
		}
		var fn json.RawMessage
		for _, k := range infer.SortedKeys(fields) {
			v := fields[k]
			switch k {
			case "type":
			case "function":
				fn = v
			default:
				if !infer.IsNull(v) {
					return nil, unsupported(param+"."+k, "")
				}
			}
		}
		if fn == nil {
			return nil, badField(param+".function", "%s.function is required", param)
		}
		ff, err := infer.DecodeObject(fn, param+".function")
		if err != nil {
			return nil, err
		}
		t, strict := infer.Tool{}, false
		for _, k := range infer.SortedKeys(ff) {
			v, pp := ff[k], param+".function."+k
			if infer.IsNull(v) {
				continue
			}
			switch k {
			case "name":
				if t.Name, err = infer.Str(v, pp); err != nil {
					return nil, err
				}
			case "description":
				if t.Description, err = infer.Str(v, pp); err != nil {
					return nil, err
				}
			case "parameters":
				t.Parameters = v
			case "strict":
				if json.Unmarshal(v, &strict) != nil {
					return nil, badField(pp, "%s must be a boolean", pp)
				}
			default:
				return nil, unsupported(pp, "")
			}
		}
		if err := infer.CheckTool(t, item, param); err != nil {
			return nil, err
		}
		if strict {
			if err := t.CompileStrict(param + ".function.parameters"); err != nil {
				return nil, err
			}
		}
		out[i] = t
	}
	if err := infer.CheckTools(out, len(raw), "tools"); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeToolChoice reads tool_choice: "none", "auto", "required" or {type: "function",
// function: {name}}.
func decodeToolChoice(raw json.RawMessage) (infer.ToolChoice, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case infer.ToolChoiceNone, infer.ToolChoiceAuto, infer.ToolChoiceRequired:
			return infer.ToolChoice{Mode: s}, nil
		}
		return infer.ToolChoice{}, badField("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}, got %q", truncate(s))
	}
	var c struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Type != "function" || c.Function.Name == "" {
		return infer.ToolChoice{}, badField("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}")
	}
	return infer.ToolChoice{Mode: infer.ToolChoiceFunction, Name: c.Function.Name}, nil
}

// maxMetadata is OpenAI's limit on metadata: 16 pairs, keys of at most 64 characters and
// values of at most 512.
const maxMetadata = 16

// decodeMetadata checks metadata (kept by OpenAI with stored completions; Loops stores
// none, so it has no effect).
func decodeMetadata(raw json.RawMessage) error {
	var m map[string]string
	if json.Unmarshal(raw, &m) != nil {
		return badField("metadata", "metadata must be an object of strings")
	}
	if len(m) > maxMetadata {
		return badField("metadata", "metadata has %d keys; at most %d are allowed", len(m), maxMetadata)
	}
	for k, v := range m {
		if len(k) > 64 || len(v) > 512 {
			return badField("metadata", "metadata keys are at most 64 characters and values at most 512")
		}
	}
	return nil
}

// content reads a message's content: a string, or a list of parts, text ({type: "text",
// text}) or, in a user message, an image ({type: "image_url", image_url: {url, detail}}
// with a data URL: infer.DecodeImageURL). The text parts are joined with newlines; parts
// is set only when there are images, and keeps every part in order for the chat template.
func content(raw json.RawMessage, param string, images bool) (string, []infer.Part, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return "", nil, badField(param, "%s must be a string or a list of content parts", param)
	}
	texts := make([]string, 0, len(list))
	parts := make([]infer.Part, 0, len(list))
	hasImage := false
	for j, p := range list {
		pp := fmt.Sprintf("%s[%d]", param, j)
		part, err := contentPart(p, pp, images)
		if err != nil {
			return "", nil, err
		}
		if part.Image == nil {
			texts = append(texts, part.Text)
		} else {
			hasImage = true
		}
		parts = append(parts, part)
	}
	if !hasImage {
		parts = nil
	}
	return strings.Join(texts, "\n"), parts, nil
}

// contentPart reads one content part (content); images says whether the message may hold
// images.
func contentPart(raw json.RawMessage, pp string, images bool) (infer.Part, error) {
	fields, err := infer.DecodeObject(raw, pp)
	if err != nil {
		return infer.Part{}, err
	}
	// The type first: it says best what is wrong with another kind of part.
	typ, err := infer.Str(fields["type"], pp+".type")
	if err != nil || (typ != "text" && typ != "image_url") {
		return infer.Part{}, unsupported(pp+".type", fmt.Sprintf("content part type %q is not supported; only \"text\" and \"image_url\"", truncate(typ)))
	}
	text := ""
	var imageURL json.RawMessage
	for _, k := range infer.SortedKeys(fields) {
		switch v := fields[k]; k {
		case "type":
		case "text":
			if text, err = infer.Str(v, pp+".text"); err != nil {
				return infer.Part{}, err
			}
		case "image_url":
			imageURL = v
		default:
			if !infer.IsNull(v) {
				return infer.Part{}, unsupported(pp+"."+k, "content parts are text ({type: \"text\", text}) or image_url ({type: \"image_url\", image_url: {url}})")
			}
		}
	}
	switch {
	case typ == "text" && imageURL == nil:
		return infer.Part{Text: text}, nil
	case typ == "text":
		return infer.Part{}, badField(pp, "%s must be {type: \"text\", text}", pp)
	case !images:
		return infer.Part{}, unsupported(pp+".type", "image_url parts belong to user messages")
	case imageURL == nil || text != "":
		return infer.Part{}, badField(pp, "%s must be {type: \"image_url\", image_url: {url}}", pp)
	}
	im, err := decodeImageURL(imageURL, pp+".image_url")
	return infer.Part{Image: im}, err
}

// decodeImageURL reads an image_url: {url, detail}. Only a data URL is taken (Loops
// fetches no URLs), and detail only "auto": the image takes the tokens the model's
// processor makes of it.
func decodeImageURL(raw json.RawMessage, param string) (*infer.Image, error) {
	fields, err := infer.DecodeObject(raw, param)
	if err != nil {
		return nil, err
	}
	url := ""
	for _, k := range infer.SortedKeys(fields) {
		v := fields[k]
		if infer.IsNull(v) {
			continue
		}
		switch k {
		case "url":
			if url, err = infer.Str(v, param+".url"); err != nil {
				return nil, err
			}
		case "detail":
			if d, err := infer.Str(v, param+".detail"); err != nil || d != "auto" {
				return nil, unsupported(param+".detail", `only "auto": the image takes the tokens the model's image processor makes of it`)
			}
		default:
			return nil, unsupported(param+"."+k, "image_url carries url (and detail)")
		}
	}
	if url == "" {
		return nil, badField(param+".url", "%s.url is required: a data URL, data:image/png;base64,…", param)
	}
	return infer.DecodeImageURL(url, param+".url")
}
