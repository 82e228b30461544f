package anthropic

import (
	"encoding/json"
	"fmt"
	"math"
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
}

// decodeRequest decodes the body of POST /v1/messages or, with count set, of POST
// /v1/messages/count_tokens (which takes no sampling fields). Every field is range-checked;
// a field the adapter does not implement is a 400 naming it.
func decodeRequest(b []byte, count bool) (*request, error) {
	fields, err := infer.DecodeObject(b, "")
	if err != nil {
		return nil, err
	}
	req := &request{temperature: 1, topP: 1, topK: -1}
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
// user's. A last assistant turn is a prefill: the answer continues it (request.conversation).
func decodeMessages(raw json.RawMessage) ([]infer.Message, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, infer.BadField("messages", "messages must be a list of {role, content} objects")
	}
	if len(list) == 0 {
		return nil, infer.BadField("messages", "messages must not be empty")
	}
	out := make([]infer.Message, len(list))
	for i, m := range list {
		param := fmt.Sprintf("messages[%d]", i)
		fields, err := infer.DecodeObject(m, param)
		if err != nil {
			return nil, err
		}
		if raw, ok := fields["role"]; ok && !infer.IsNull(raw) {
			if out[i].Role, err = infer.Str(raw, param+".role"); err != nil {
				return nil, err
			}
		}
		switch out[i].Role {
		case "user", "assistant":
		case "":
			return nil, infer.BadField(param+".role", "%s.role is required", param)
		default:
			return nil, infer.BadField(param+".role", "role %q is not a Messages role: use user or assistant (the system prompt is the top-level system field)", infer.Truncate(out[i].Role))
		}
		hasContent := false
		for _, k := range infer.SortedKeys(fields) {
			v := fields[k]
			switch {
			case k == "role", infer.IsNull(v):
			case k == "content":
				if out[i].Content, err = content(v, param+".content", true); err != nil {
					return nil, err
				}
				hasContent = true
			default:
				return nil, unsupported(param+"."+k, "messages carry role and content only")
			}
		}
		if !hasContent {
			return nil, infer.BadField(param+".content", "%s.content is required", param)
		}
	}
	if out[0].Role != "user" {
		return nil, infer.BadField("messages[0].role", "the first message must be the user's")
	}
	return out, nil
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
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
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
	if n := len(req.messages); n > 0 && req.messages[n-1].Role == "assistant" {
		return req.messages[n-1].Content
	}
	return ""
}
