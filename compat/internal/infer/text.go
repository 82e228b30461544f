package infer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"

	"github.com/loops-dev/loops/backends/reference/tokenizer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/hfcache"
)

// Message is one chat message.
type Message struct {
	Role    string
	Content string
	// Parts, when not empty, are the message's content as parts, some of them images
	// (Content is then their text joined): the chat template is given them as a list of
	// {"type": "text", "text"} and {"type": "image"}, which a vision-language model's
	// template renders as its image placeholder.
	Parts []Part
	// ToolCalls are an assistant message's calls of tools.
	ToolCalls []ToolCall
	// ToolCallID is, on a message of role "tool", the id of the call it answers; Name is
	// that call's tool when known.
	ToolCallID, Name string
}

// Text is what turns a base model's messages into tokens and its tokens into text: its
// tokenizer.json, and the chat template and special tokens of its tokenizer_config.json.
type Text struct {
	tok      *tokenizer.Tokenizer
	tmpl     *exec.Template // nil: the model has no chat template
	bos, eos string
	// tools is how the template's model writes tool calls (NoToolFormat: it renders none).
	tools ToolFormat
	// special are the ids of added tokens marked special (EOS, chat markers): they end or
	// frame a message and are left out of the text returned (skip_special_tokens).
	special map[int32]bool
}

// modelCache loads each base model's text once. Its size is the number of base models the
// core serves.
type modelCache struct {
	models loopsv1connect.ModelServiceHandler
	mu     sync.Mutex
	byName map[string]*Text
}

func newModelCache(m loopsv1connect.ModelServiceHandler) *modelCache {
	return &modelCache{models: m, byName: map[string]*Text{}}
}

// info returns base model name as the caller's workspace sees it (its limits lowered to the
// workspace's).
func (mc *modelCache) info(ctx context.Context, name string) (*loopsv1.ModelInfo, error) {
	res, err := mc.models.ListModels(ctx, &loopsv1.ListModelsRequest{})
	if err != nil {
		return nil, err
	}
	for _, m := range res.GetModels() {
		if m.GetName() == name {
			return m, nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("model %q is not served (GET /models lists those that are)", name))
}

// get returns the text of a base model, loading it on first use.
func (mc *modelCache) get(info *loopsv1.ModelInfo) (*Text, error) {
	name := info.GetName()
	mc.mu.Lock()
	t, ok := mc.byName[name]
	mc.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := loadText(info)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("model %q: %w", name, err))
	}
	mc.mu.Lock()
	mc.byName[name] = t
	mc.mu.Unlock()
	return t, nil
}

// loadText reads the tokenizer files of a model: info's tokenizer_id is a folder, or a
// Hugging Face id found in the local hub cache.
func loadText(info *loopsv1.ModelInfo) (*Text, error) {
	id := info.GetTokenizerId()
	if id == "" {
		id = info.GetName()
	}
	dir, err := tokenizerDir(id)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.LoadHF(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("reading its tokenizer: %w", err)
	}
	t := &Text{tok: tok, special: map[int32]bool{}}
	if err := t.readSpecial(filepath.Join(dir, "tokenizer.json")); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	t.bos, t.eos = tokenString(cfg.BOS), tokenString(cfg.EOS)
	src := chatTemplateSource(cfg.ChatTemplate)
	if src == "" {
		if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
			src = string(b)
		}
	}
	if src != "" {
		if t.tmpl, err = compileTemplate(src); err != nil {
			return nil, fmt.Errorf("its chat template does not compile: %w", err)
		}
		t.tools = toolFormatOf(src)
	}
	return t, nil
}

// readSpecial records the added tokens that tokenizer.json marks special.
func (t *Text) readSpecial(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc struct {
		Added []struct {
			ID      int32 `json:"id"`
			Special bool  `json:"special"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, a := range doc.Added {
		if a.Special {
			t.special[a.ID] = true
		}
	}
	return nil
}

// tokenString reads a special token of tokenizer_config.json: a string or {"content": …}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(raw, &obj)
	return obj.Content
}

// chatTemplateSource reads chat_template: a string, or a list of {name, template} of which
// the one named "default" is used (transformers' rule).
func chatTemplateSource(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(raw, &named) == nil {
		for _, n := range named {
			if n.Name == "default" {
				return n.Template
			}
		}
	}
	return ""
}

// compileTemplate parses a chat template with transformers' Jinja settings: trim_blocks and
// lstrip_blocks on.
func compileTemplate(src string) (*exec.Template, error) {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	const root = "chat_template"
	fs, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, err
	}
	loader, err := loaders.NewShiftedLoader(root, strings.NewReader(src), fs)
	if err != nil {
		return nil, err
	}
	return exec.NewTemplate(root, cfg, loader, templateEnvironment)
}

// templateError is raise_exception's error: the messages break the template's rules.
type templateError struct{ msg string }

func (e *templateError) Error() string { return e.msg }

// ToolFormat is how the model writes tool calls (NoToolFormat: its chat template renders
// no tools).
func (t *Text) ToolFormat() ToolFormat { return t.tools }

// Render applies the chat template to msgs, with the generation prompt of the assistant's
// turn appended; tools, when not empty, are passed to the template as transformers'
// apply_chat_template(tools=…) passes them: [{"type": "function", "function": {"name",
// "description", "parameters"}}]. A message's tool calls are [{"id", "type": "function",
// "function": {"name", "arguments": {…}}}] with the arguments an object (as vLLM gives
// them to templates), and a tool message carries tool_call_id and name.
func (t *Text) Render(msgs []Message, tools []Tool) (string, error) {
	if t.tmpl == nil {
		return "", BadField("model", "this model has no chat template (no chat_template in its tokenizer_config.json); use POST /completions with a prompt")
	}
	var tv templateValues
	defer tv.release()
	list := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		msg := map[string]any{"role": m.Role, "content": m.Content}
		if len(m.Parts) > 0 {
			parts := make([]any, len(m.Parts))
			for j, p := range m.Parts {
				if p.Image != nil {
					parts[j] = map[string]any{"type": "image"}
				} else {
					parts[j] = map[string]any{"type": "text", "text": p.Text}
				}
			}
			msg["content"] = parts
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				args, err := tv.value(c.Arguments)
				if err != nil {
					return "", BadField(fmt.Sprintf("messages[%d]", i), "the arguments of call %d are not JSON: %v", j, err)
				}
				calls[j] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": args}}
			}
			msg["tool_calls"] = calls
		}
		if m.Role == "tool" {
			msg["tool_call_id"] = m.ToolCallID
			if m.Name != "" {
				msg["name"] = m.Name
			}
		}
		list[i] = msg
	}
	vars := map[string]any{
		"messages":              list,
		"add_generation_prompt": true,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
		"raise_exception": func(_ *exec.Evaluator, p *exec.VarArgs) (*exec.Value, error) {
			msg := "the chat template refused the messages"
			if len(p.Args) > 0 {
				msg = p.Args[0].String()
			}
			return nil, &templateError{msg: msg}
		},
	}
	if len(tools) > 0 {
		defs := make([]any, len(tools))
		for i, tl := range tools {
			raw, err := toolJSON(tl)
			if err != nil {
				return "", BadField("tools", "tool %q: %v", tl.Name, err)
			}
			if defs[i], err = tv.value(raw); err != nil {
				return "", BadField("tools", "tool %q: %v", tl.Name, err)
			}
		}
		vars["tools"] = defs
	}
	out, err := t.tmpl.ExecuteToString(exec.NewContext(vars))
	if err != nil {
		var te *templateError
		if errors.As(err, &te) {
			return "", BadField("messages", "the model's chat template refused the messages: %s", te.msg)
		}
		return "", BadField("messages", "the model's chat template failed on these messages: %v", err)
	}
	return out, nil
}

// toolJSON is a tool as chat templates take it, OpenAI's function tool:
// {"type": "function", "function": {"name", "description", "parameters"}} (the parameters
// in the client's key order).
func toolJSON(t Tool) (json.RawMessage, error) {
	var b strings.Builder
	b.WriteString(`{"type": "function", "function": {"name": `)
	b.Write(jsonString(t.Name))
	if t.Description != "" {
		b.WriteString(`, "description": `)
		b.Write(jsonString(t.Description))
	}
	if len(t.Parameters) > 0 {
		b.WriteString(`, "parameters": `)
		b.Write(t.Parameters)
	}
	b.WriteString("}}")
	if !json.Valid([]byte(b.String())) {
		return nil, errors.New("its parameters are not valid JSON")
	}
	return json.RawMessage(b.String()), nil
}

// Encode tokenizes text (added tokens such as chat markers are matched first).
func (t *Text) Encode(s string) []int32 {
	return int32s(t.tok.Encode(s))
}

func int32s(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// MaxBytes is the most bytes of text that limit tokens can hold (limit × the tokenizer's
// MaxTokenBytes), or -1 for no limit (limit 0).
func (t *Text) MaxBytes(limit int) int64 {
	if limit <= 0 {
		return -1
	}
	return int64(limit) * int64(t.tok.MaxTokenBytes())
}

// checkBytes refuses a text of size bytes for param that cannot fit in limit tokens of
// model name (0: no limit), before any work on it.
func (t *Text) checkBytes(size, limit int, name, param string) error {
	if c := t.MaxBytes(limit); c >= 0 && int64(size) > c {
		return tooLong(param, "%s: %d bytes of text cannot fit in %s's limit of %d tokens (max_sequence_length; a token of its tokenizer holds at most %d bytes, so at most %d bytes fit): shorten it",
			param, size, name, limit, t.tok.MaxTokenBytes(), c)
	}
	return nil
}

// encodeBounded tokenizes s for param, stopping as soon as it is over limit tokens of model
// name (0: no limit), which it then refuses.
func (t *Text) encodeBounded(s string, limit int, name, param string) ([]int32, error) {
	if limit <= 0 {
		return t.Encode(s), nil
	}
	ids, ok := t.tok.EncodeLimit(s, limit)
	if !ok {
		return nil, tooLong(param, "%s: the prompt is more than %d tokens, %s's limit (max_sequence_length): shorten it", param, limit, name)
	}
	return int32s(ids), nil
}

// Decode turns sampled tokens into text, leaving out special tokens.
func (t *Text) Decode(toks []int32) string {
	ids := make([]int, 0, len(toks))
	for _, id := range toks {
		if !t.special[id] {
			ids = append(ids, int(id))
		}
	}
	return t.tok.Decode(ids)
}

// TokenText is the text of one token as the tokenizer decodes it alone, special tokens
// included (the token strings of logprobs).
func (t *Text) TokenText(tok int32) string { return t.tok.Decode([]int{int(tok)}) }

// tokenizerDir finds the folder of a tokenizer id (hfcache.TokenizerDir).
func tokenizerDir(id string) (string, error) { return hfcache.TokenizerDir(id) }
