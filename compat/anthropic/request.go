package anthropic

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/loops-dev/loops/compat/internal/infer"
)

// maxStopSequences bounds stop_sequences (each is matched against the text after every
// sampled token).
const maxStopSequences = 16

// request is a decoded, range-checked Messages request.
type request struct {
	model       string
	system      string
	hasSystem   bool
	messages    []infer.Message
	maxTokens   int32
	temperature float32
	topP        float32
	topK        int32
	stop        []string
	stream      bool
	// tools offered, the tool choice (Mode "" when not given) and whether the answer may
	// make several calls (not disable_parallel_tool_use).
	tools      []infer.Tool
	toolChoice infer.ToolChoice
	parallel   bool
}

// toolsActive says whether the answer is parsed for tool calls: tools are given and
// tool_choice is not none.
func (req *request) toolsActive() bool {
	return len(req.tools) > 0 && req.toolChoice.Mode != infer.ToolChoiceNone
}

// maxCalls is the most calls one answer may make (0: any number).
func (req *request) maxCalls() int {
	if req.parallel {
		return 0
	}
	return 1
}

// decodeRequest decodes the body of POST /v1/messages or, with count set, of POST
// /v1/messages/count_tokens (which takes no sampling fields). Every field is range-checked;
// a field the adapter does not implement is a 400 naming it.
func decodeRequest(b []byte, count bool) (*request, error) {
	fields, err := infer.DecodeObject(b, "")
	if err != nil {
		return nil, err
	}
	req := &request{temperature: 1, topP: 1, topK: -1, parallel: true}
	hasMessages, hasMaxTokens := false, false
	for _, name := range infer.SortedKeys(fields) {
		raw := fields[name]
		if infer.IsNull(raw) {
			continue
		}
		sampling := true
		switch name {
		case "model":
			sampling = false
			if req.model, err = infer.Str(raw, name); err != nil {
				return nil, err
			}
		case "messages":
			sampling = false
			if req.messages, err = decodeMessages(raw); err != nil {
				return nil, err
			}
			hasMessages = true
		case "system":
			sampling = false
			if req.system, err = content(raw, name, false); err != nil {
				return nil, err
			}
			req.hasSystem = true
		case "max_tokens":
			v, err := infer.Integer(raw, name, 1, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			req.maxTokens, hasMaxTokens = int32(v), true
		case "temperature":
			v, err := infer.Float(raw, name, 0, 1)
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
				return nil, infer.BadField(name, "top_p must be in (0, 1], got 0")
			}
			req.topP = float32(v)
		case "top_k":
			v, err := infer.Integer(raw, name, 0, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			if v > 0 {
				req.topK = int32(v)
			}
		case "stop_sequences":
			if req.stop, err = decodeStop(raw); err != nil {
				return nil, err
			}
		case "stream":
			if err := json.Unmarshal(raw, &req.stream); err != nil {
				return nil, infer.BadField(name, "stream must be a boolean")
			}
		case "tools":
			sampling = false
			if req.tools, err = decodeTools(raw); err != nil {
				return nil, err
			}
		case "tool_choice":
			sampling = false
			if req.toolChoice, req.parallel, err = decodeToolChoice(raw); err != nil {
				return nil, err
			}
		case "service_tier":
			if tier, err := infer.Str(raw, name); err != nil || (tier != "auto" && tier != "standard_only") {
				return nil, unsupported(name, `only "auto" or "standard_only" (Loops serves every request in one tier)`)
			}
		case "thread":
			// Server-side message threads: Loops keeps none. false (the neutral value) is
			// accepted; any other is refused with the rejection the client's tool runner reads
			// as "continue without a thread" (error.details.error_code
			// thread_unsupported_request).
			var th bool
			if json.Unmarshal(raw, &th) != nil || th {
				return nil, &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest,
					message: "thread: Loops keeps no server-side message threads; send the whole conversation without thread",
					details: map[string]any{"error_code": "thread_unsupported_request", "unsupported": []string{"thread"}}}
			}
		case "cache_control":
			// A prompt-caching hint: accepted, and has no effect on the answer.
			if _, err := infer.DecodeObject(raw, name); err != nil {
				return nil, err
			}
		case "metadata":
			// metadata.user_id is an end-user id for the caller's own abuse tracking:
			// accepted, and has no effect.
			if err := decodeMetadata(raw); err != nil {
				return nil, err
			}
		default:
			return nil, unsupported(name, "")
		}
		if count && sampling {
			return nil, unsupported(name, "count_tokens takes model, system and messages")
		}
	}
	switch {
	case req.model == "":
		return nil, infer.BadField("model", "model is required: a base model id, a tinker://…/sampler_weights/… path or \"<base model>;<checkpoint path>\"")
	case !hasMessages:
		return nil, infer.BadField("messages", "messages is required")
	case !count && !hasMaxTokens:
		return nil, infer.BadField("max_tokens", "max_tokens is required")
	}
	if err := infer.CheckChoice(req.toolChoice, req.tools, "tool_choice"); err != nil {
		return nil, err
	}
	return req, nil
}

func decodeMetadata(raw json.RawMessage) error {
	fields, err := infer.DecodeObject(raw, "metadata")
	if err != nil {
		return err
	}
	for _, k := range infer.SortedKeys(fields) {
		v := fields[k]
		switch {
		case infer.IsNull(v):
		case k == "user_id":
			if _, err := infer.Str(v, "metadata.user_id"); err != nil {
				return err
			}
		default:
			return unsupported("metadata."+k, "")
		}
	}
	return nil
}

func decodeStop(raw json.RawMessage) ([]string, error) {
	var list []string
	if json.Unmarshal(raw, &list) != nil {
		return nil, infer.BadField("stop_sequences", "stop_sequences must be a list of strings")
	}
	if len(list) > maxStopSequences {
		return nil, infer.BadField("stop_sequences", "stop_sequences has %d sequences; at most %d are allowed", len(list), maxStopSequences)
	}
	for i, s := range list {
		if s == "" {
			return nil, infer.BadField(fmt.Sprintf("stop_sequences[%d]", i), "stop sequences must not be empty")
		}
	}
	if len(list) == 0 {
		return nil, nil
	}
	return list, nil
}

// decodeMessages reads the conversation: user and assistant turns, the first one the
// user's, as chat template messages: an assistant turn's tool_use blocks are its tool
// calls, and a user turn's tool_result blocks are "tool" messages (before the turn's text,
// if any). A last assistant turn without tool_use is a prefill: the answer continues it
// (request.conversation).
func decodeMessages(raw json.RawMessage) ([]infer.Message, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, infer.BadField("messages", "messages must be a list of {role, content} objects")
	}
	if len(list) == 0 {
		return nil, infer.BadField("messages", "messages must not be empty")
	}
	var out []infer.Message
	callNames := map[string]string{} // tool_use id → its tool
	for i, m := range list {
		param := fmt.Sprintf("messages[%d]", i)
		fields, err := infer.DecodeObject(m, param)
		if err != nil {
			return nil, err
		}
		var role string
		if raw, ok := fields["role"]; ok && !infer.IsNull(raw) {
			if role, err = infer.Str(raw, param+".role"); err != nil {
				return nil, err
			}
		}
		switch role {
		case "user", "assistant":
		case "":
			return nil, infer.BadField(param+".role", "%s.role is required", param)
		default:
			return nil, infer.BadField(param+".role", "role %q is not a Messages role: use user or assistant (the system prompt is the top-level system field)", infer.Truncate(role))
		}
		if i == 0 && role != "user" {
			return nil, infer.BadField("messages[0].role", "the first message must be the user's")
		}
		var blocks *turn
		for _, k := range infer.SortedKeys(fields) {
			v := fields[k]
			switch {
			case k == "role", infer.IsNull(v):
			case k == "content":
				if blocks, err = decodeTurn(v, param+".content", role); err != nil {
					return nil, err
				}
			default:
				return nil, unsupported(param+"."+k, "messages carry role and content only")
			}
		}
		if blocks == nil {
			return nil, infer.BadField(param+".content", "%s.content is required", param)
		}
		for _, c := range blocks.calls {
			callNames[c.ID] = c.Name
		}
		for _, r := range blocks.results {
			r.Name = callNames[r.ToolCallID]
			out = append(out, r)
		}
		if role == "assistant" || blocks.hasText || len(blocks.parts) > 0 || len(blocks.results) == 0 {
			out = append(out, infer.Message{Role: role, Content: blocks.text, Parts: blocks.parts, ToolCalls: blocks.calls})
		}
	}
	return out, nil
}

// turn is a message's content: its text, and its tool calls (assistant) or results (user).
type turn struct {
	text    string
	hasText bool
	// parts are the text and image blocks in order, set only when there are images.
	parts   []infer.Part
	calls   []infer.ToolCall
	results []infer.Message
}

// decodeTurn reads a message's content: a string, or a list of text blocks, tool_use
// blocks (assistant) and tool_result blocks (user).
func decodeTurn(raw json.RawMessage, param, role string) (*turn, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, infer.BadField(param, "%s must not be empty", param)
		}
		return &turn{text: s, hasText: true}, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, infer.BadField(param, "%s must be a string or a list of content blocks", param)
	}
	if len(blocks) == 0 {
		return nil, infer.BadField(param, "%s must not be empty", param)
	}
	t := &turn{}
	var texts []string
	hasImage := false
	for j, b := range blocks {
		pp := fmt.Sprintf("%s[%d]", param, j)
		fields, err := infer.DecodeObject(b, pp)
		if err != nil {
			return nil, err
		}
		typ := ""
		if v, ok := fields["type"]; ok && !infer.IsNull(v) {
			if typ, err = infer.Str(v, pp+".type"); err != nil {
				return nil, err
			}
		}
		switch {
		case typ == "text":
			text, err := content(json.RawMessage("["+string(b)+"]"), pp, false)
			if err != nil {
				return nil, err
			}
			texts = append(texts, text)
			t.parts = append(t.parts, infer.Part{Text: text})
			t.hasText = true
		case typ == "image" && role == "user":
			im, err := decodeImage(fields, pp)
			if err != nil {
				return nil, err
			}
			t.parts = append(t.parts, infer.Part{Image: im})
			hasImage = true
		case typ == "tool_use" && role == "assistant":
			var u struct {
				ID    string          `json:"id"`
				Name  string          `json:"name"`
				Input json.RawMessage `json:"input"`
			}
			for _, k := range infer.SortedKeys(fields) {
				switch k {
				case "type", "id", "name", "input", "cache_control":
				default:
					return nil, unsupported(pp+"."+k, "")
				}
			}
			var obj map[string]json.RawMessage
			if json.Unmarshal(b, &u) != nil || u.ID == "" || u.Name == "" || json.Unmarshal(u.Input, &obj) != nil || obj == nil {
				return nil, infer.BadField(pp, "%s must be {type: \"tool_use\", id, name, input: an object}", pp)
			}
			t.calls = append(t.calls, infer.ToolCall{ID: u.ID, Name: u.Name, Arguments: u.Input})
		case typ == "tool_result" && role == "user":
			r := infer.Message{Role: "tool"}
			for _, k := range infer.SortedKeys(fields) {
				v := fields[k]
				switch {
				case k == "type", k == "cache_control", infer.IsNull(v):
				case k == "tool_use_id":
					if r.ToolCallID, err = infer.Str(v, pp+"."+k); err != nil {
						return nil, err
					}
				case k == "content":
					if r.Content, err = content(v, pp+".content", false); err != nil {
						return nil, err
					}
				case k == "is_error":
					// The result is an error message: the model reads it as the result's text.
					var b bool
					if json.Unmarshal(v, &b) != nil {
						return nil, infer.BadField(pp+"."+k, "%s.is_error must be a boolean", pp)
					}
				default:
					return nil, unsupported(pp+"."+k, "")
				}
			}
			if r.ToolCallID == "" {
				return nil, infer.BadField(pp+".tool_use_id", "%s.tool_use_id is required", pp)
			}
			t.results = append(t.results, r)
		default:
			return nil, unsupported(pp+".type", fmt.Sprintf("content block type %q is not supported in a %s turn; only \"text\"%s", infer.Truncate(typ), role,
				map[string]string{"assistant": ", \"tool_use\"", "user": ", \"image\", \"tool_result\""}[role]))
		}
	}
	t.text = strings.Join(texts, "\n")
	if !hasImage {
		t.parts = nil
	}
	return t, nil
}

// decodeImage reads an image block: {type: "image", source: {type: "base64", media_type,
// data}} (infer.DecodeImage checks it). A url source is refused: Loops fetches no URLs.
func decodeImage(fields map[string]json.RawMessage, pp string) (*infer.Image, error) {
	var src json.RawMessage
	for _, k := range infer.SortedKeys(fields) {
		v := fields[k]
		switch {
		case k == "type", k == "cache_control", infer.IsNull(v):
		case k == "source":
			src = v
		default:
			return nil, unsupported(pp+"."+k, "an image block carries source")
		}
	}
	if src == nil {
		return nil, infer.BadField(pp+".source", "%s.source is required: {type: \"base64\", media_type, data}", pp)
	}
	sf, err := infer.DecodeObject(src, pp+".source")
	if err != nil {
		return nil, err
	}
	var typ, mediaType, data string
	for _, k := range infer.SortedKeys(sf) {
		v, kp := sf[k], pp+".source."+k
		switch {
		case infer.IsNull(v):
		case k == "type":
			if typ, err = infer.Str(v, kp); err != nil {
				return nil, err
			}
		case k == "media_type":
			if mediaType, err = infer.Str(v, kp); err != nil {
				return nil, err
			}
		case k == "data":
			if data, err = infer.Str(v, kp); err != nil {
				return nil, err
			}
		case k == "url" && typ == "url": // refused below, with the reason
		default:
			return nil, unsupported(kp, "an image source is {type: \"base64\", media_type, data}")
		}
	}
	switch typ {
	case "base64":
	case "url":
		return nil, unsupported(pp+".source.type", "Loops fetches no URLs: send the image's bytes, {type: \"base64\", media_type, data}")
	default:
		return nil, unsupported(pp+".source.type", fmt.Sprintf("image source type %q is not supported; only \"base64\"", infer.Truncate(typ)))
	}
	return infer.DecodeImage(mediaType, data, pp+".source")
}

// decodeTools reads tools: [{name, description, input_schema}] (type "custom" or absent),
// bounded (infer.CheckTools).
func decodeTools(raw json.RawMessage) ([]infer.Tool, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, infer.BadField("tools", "tools must be a list of {name, description, input_schema} objects")
	}
	out := make([]infer.Tool, len(list))
	for i, item := range list {
		param := fmt.Sprintf("tools[%d]", i)
		fields, err := infer.DecodeObject(item, param)
		if err != nil {
			return nil, err
		}
		t := infer.Tool{}
		for _, k := range infer.SortedKeys(fields) {
			v, pp := fields[k], param+"."+k
			if infer.IsNull(v) {
				continue
			}
			switch k {
			case "type":
				if typ, err := infer.Str(v, pp); err != nil || typ != "custom" {
					return nil, unsupported(pp, "only client tools (type \"custom\" or none): Loops runs no server tools")
				}
			case "name":
				if t.Name, err = infer.Str(v, pp); err != nil {
					return nil, err
				}
			case "description":
				if t.Description, err = infer.Str(v, pp); err != nil {
					return nil, err
				}
			case "input_schema":
				t.Parameters = v
			case "cache_control":
			default:
				return nil, unsupported(pp, "")
			}
		}
		if t.Parameters == nil {
			return nil, infer.BadField(param+".input_schema", "%s.input_schema is required", param)
		}
		if err := infer.CheckTool(t, item, param); err != nil {
			return nil, err
		}
		out[i] = t
	}
	if err := infer.CheckTools(out, len(raw), "tools"); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeToolChoice reads tool_choice: {type: auto | any | tool (with name) | none,
// disable_parallel_tool_use}; parallel is false when disable_parallel_tool_use is true.
func decodeToolChoice(raw json.RawMessage) (c infer.ToolChoice, parallel bool, err error) {
	var tc struct {
		Type    string `json:"type"`
		Name    string `json:"name"`
		Disable *bool  `json:"disable_parallel_tool_use"`
	}
	fields, err := infer.DecodeObject(raw, "tool_choice")
	if err != nil {
		return c, false, err
	}
	for _, k := range infer.SortedKeys(fields) {
		switch k {
		case "type", "name", "disable_parallel_tool_use":
		default:
			return c, false, unsupported("tool_choice."+k, "")
		}
	}
	if json.Unmarshal(raw, &tc) != nil {
		return c, false, infer.BadField("tool_choice", "tool_choice must be {type: auto | any | tool | none, name, disable_parallel_tool_use}")
	}
	parallel = tc.Disable == nil || !*tc.Disable
	switch tc.Type {
	case "auto":
		c.Mode = infer.ToolChoiceAuto
	case "none":
		c.Mode = infer.ToolChoiceNone
	case "any":
		c.Mode = infer.ToolChoiceRequired
	case "tool":
		if tc.Name == "" {
			return c, false, infer.BadField("tool_choice.name", "tool_choice of type tool needs a name")
		}
		c = infer.ToolChoice{Mode: infer.ToolChoiceFunction, Name: tc.Name}
	default:
		return c, false, infer.BadField("tool_choice.type", "tool_choice.type must be auto, any, tool or none, got %q", infer.Truncate(tc.Type))
	}
	return c, parallel, nil
}

// content reads message or system content: a string, or a list of text blocks (their texts
// joined with newlines). cache_control on a block is accepted: it is a caching hint that
// does not change the answer.
func content(raw json.RawMessage, param string, nonEmpty bool) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if nonEmpty && s == "" {
			return "", infer.BadField(param, "%s must not be empty", param)
		}
		return s, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return "", infer.BadField(param, "%s must be a string or a list of text blocks", param)
	}
	if nonEmpty && len(blocks) == 0 {
		return "", infer.BadField(param, "%s must not be empty", param)
	}
	texts := make([]string, 0, len(blocks))
	for j, b := range blocks {
		pp := fmt.Sprintf("%s[%d]", param, j)
		fields, err := infer.DecodeObject(b, pp)
		if err != nil {
			return "", err
		}
		// The type first: it says best what is wrong with an image or tool block.
		typ, text := "", ""
		if v, ok := fields["type"]; ok && !infer.IsNull(v) {
			if typ, err = infer.Str(v, pp+".type"); err != nil {
				return "", err
			}
		}
		if typ != "text" {
			return "", unsupported(pp+".type", fmt.Sprintf("content block type %q is not supported; only \"text\"", infer.Truncate(typ)))
		}
		for _, k := range infer.SortedKeys(fields) {
			v := fields[k]
			switch {
			case infer.IsNull(v), k == "type":
			case k == "text":
				if text, err = infer.Str(v, pp+".text"); err != nil {
					return "", err
				}
			case k == "cache_control":
			default:
				return "", unsupported(pp+"."+k, "only text blocks are supported")
			}
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

// conversation is the messages as the chat template takes them: the system prompt first.
func (req *request) conversation() []infer.Message {
	msgs := req.messages
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" && len(msgs[n-1].ToolCalls) == 0 {
		msgs = msgs[:n-1]
	}
	if !req.hasSystem || req.system == "" {
		return msgs
	}
	return append([]infer.Message{{Role: "system", Content: req.system}}, msgs...)
}

// prefill is the start of the answer given as a last assistant turn: the sample continues
// it, and the answer's content is the continuation only (as Anthropic's API answers).
func (req *request) prefill() string {
	if n := len(req.messages); n > 0 && req.messages[n-1].Role == "assistant" && len(req.messages[n-1].ToolCalls) == 0 {
		return req.messages[n-1].Content
	}
	return ""
}
