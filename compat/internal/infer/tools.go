package infer

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Bounds on a request's tools, checked before anything is rendered (the body itself is
// bounded by the adapter's MaxBodyBytes).
const (
	// MaxTools is the most tools a request may offer (OpenAI's limit: 128 functions).
	MaxTools = 128
	// MaxToolSchemaBytes bounds one tool's JSON (its name, description and parameters).
	MaxToolSchemaBytes = 64 << 10
	// MaxToolsBytes bounds the JSON of all of a request's tools together.
	MaxToolsBytes = 1 << 20
	// MaxToolSchemaDepth bounds the nesting of a tool's parameters schema.
	MaxToolSchemaDepth = 32
)

// Tool is a function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments (an object); nil when not given.
	Parameters json.RawMessage
	// strict is Parameters compiled (CompileStrict) when the tool is strict: a call whose
	// arguments do not validate against it is not a call (it stays text).
	strict *jsonschema.Schema
}

// CompileStrict makes t strict (OpenAI's function.strict): its parameters schema is compiled
// (param names it in the error), and ParseToolCalls then takes only calls whose arguments
// validate against it. The schema may refer to itself only: no file or URL is ever loaded.
func (t *Tool) CompileStrict(param string) error {
	schema := ArgumentsSchema(*t)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return BadField(param, "%s is not JSON: %v", param, err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no scheme: $ref to a file or URL is refused
	const loc = "loops:tool-parameters.json"
	if err := c.AddResource(loc, doc); err != nil {
		return BadField(param, "%s: %v", param, err)
	}
	if t.strict, err = c.Compile(loc); err != nil {
		return BadField(param, "%s is not a JSON schema that can be checked (strict: true validates every call's arguments against it): %v", param, err)
	}
	return nil
}

// validArguments says whether args (a JSON object) may be t's arguments: always, unless t is
// strict and they do not validate.
func (t *Tool) validArguments(args json.RawMessage) bool {
	if t == nil || t.strict == nil {
		return true
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	return err == nil && t.strict.Validate(v) == nil
}

// ToolCall is a call of a tool: one the model made, or one of the conversation.
type ToolCall struct {
	// ID identifies the call (OpenAI's tool_calls[].id, Anthropic's tool_use id).
	ID   string
	Name string
	// Arguments is the JSON object of the arguments.
	Arguments json.RawMessage
}

// Tool choice modes.
const (
	ToolChoiceAuto     = "auto"     // the model decides (the default when tools are given)
	ToolChoiceNone     = "none"     // no call: tools are not offered to the model
	ToolChoiceRequired = "required" // at least one call (Anthropic: "any")
	ToolChoiceFunction = "function" // a call of the tool named Name (Anthropic: "tool")
)

// ToolChoice says whether and which tool the model must call.
type ToolChoice struct {
	Mode string
	Name string // ToolChoiceFunction: the tool
}

var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// CheckTool checks a tool's name and sizes; param names it in errors. raw is the tool's
// JSON as the client sent it.
func CheckTool(t Tool, raw json.RawMessage, param string) error {
	if !toolNameRE.MatchString(t.Name) {
		return BadField(param+".name", "%s.name %q must be 1 to 64 letters, digits, underscores or dashes", param, Truncate(t.Name))
	}
	if len(raw) > MaxToolSchemaBytes {
		return BadField(param, "%s is %d bytes of JSON; the server's limit is %d per tool: shorten its description or schema", param, len(raw), MaxToolSchemaBytes)
	}
	if t.Parameters != nil {
		if d := jsonDepth(t.Parameters); d > MaxToolSchemaDepth {
			return BadField(param, "%s: its schema nests %d levels deep; the server's limit is %d", param, d, MaxToolSchemaDepth)
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(t.Parameters, &obj) != nil {
			return BadField(param, "%s: the parameters schema must be a JSON object", param)
		}
	}
	return nil
}

// CheckTools checks the count and total size of a request's tools (each checked with
// CheckTool) and that their names differ; total is the bytes of their JSON.
func CheckTools(tools []Tool, total int, param string) error {
	if len(tools) > MaxTools {
		return BadField(param, "%s has %d tools; the server's limit is %d", param, len(tools), MaxTools)
	}
	if total > MaxToolsBytes {
		return BadField(param, "%s is %d bytes of JSON; the server's limit is %d", param, total, MaxToolsBytes)
	}
	seen := map[string]bool{}
	for i, t := range tools {
		if seen[t.Name] {
			return BadField(fmt.Sprintf("%s[%d].name", param, i), "two tools are named %q: names must differ", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// CheckChoice checks that a named tool choice names one of tools; param names the choice.
func CheckChoice(c ToolChoice, tools []Tool, param string) error {
	if c.Mode == "" || c.Mode == ToolChoiceAuto || c.Mode == ToolChoiceNone {
		return nil
	}
	if len(tools) == 0 {
		return BadField(param, "%s %s needs tools", param, c.Mode)
	}
	if c.Mode == ToolChoiceFunction {
		for _, t := range tools {
			if t.Name == c.Name {
				return nil
			}
		}
		return BadField(param, "%s names %q, which is not one of the tools", param, Truncate(c.Name))
	}
	return nil
}

// jsonDepth is the nesting depth of valid JSON b.
func jsonDepth(b []byte) int {
	depth, most, inStr, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
			most = max(most, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return most
}

// NewCallID returns a fresh id for a call the model made: prefix and 24 random characters.
func NewCallID(prefix string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return prefix + string(b)
}

// ToolFormat is how a model family writes tool calls in its output, found from its chat
// template.
type ToolFormat int

const (
	// NoToolFormat: the chat template renders no tools; a request that offers tools is
	// refused.
	NoToolFormat ToolFormat = iota
	// HermesFormat is Qwen2.5's and Qwen3's (and Hermes'): each call is
	// <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>, after optional text.
	HermesFormat
	// Llama3Format is Llama 3.1/3.2/3.3's JSON tool calls: the whole answer is
	// {"name": …, "parameters": {…}} (after an optional <|python_tag|>), several separated by
	// ";".
	Llama3Format
)

func (f ToolFormat) String() string {
	switch f {
	case HermesFormat:
		return "<tool_call> JSON (Qwen, Hermes)"
	case Llama3Format:
		return "Llama 3 JSON"
	}
	return "none"
}

// toolFormatOf finds the tool call format a chat template teaches its model.
func toolFormatOf(src string) ToolFormat {
	switch {
	case strings.Contains(src, "<tool_call>"):
		return HermesFormat
	case strings.Contains(src, "<|start_header_id|>") && strings.Contains(src, "tools") && strings.Contains(src, `"parameters"`):
		return Llama3Format
	}
	return NoToolFormat
}

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
	pythonTag   = "<|python_tag|>"
)

// ForcedPrefix is the start of the answer that forces a call under choice: the format's
// call opening (required), with the tool's name (a named function); "" when nothing is
// forced. It never ends in a space: byte-level BPE tokenizers join a space to the word
// after it (` {` is one token), so a prefix cut after a space would make the model
// continue from a split it never saw. The sample continues it; only the call's opening and name are forced, not its
// arguments (ArgumentsSchema is the schema a constrained decoder would enforce).
func (f ToolFormat) ForcedPrefix(choice ToolChoice) string {
	switch choice.Mode {
	case ToolChoiceRequired:
		switch f {
		case HermesFormat:
			return hermesOpen + "\n"
		case Llama3Format:
			return `{"name": "`
		}
	case ToolChoiceFunction:
		name := string(jsonString(choice.Name))
		switch f {
		case HermesFormat:
			return hermesOpen + "\n{\"name\": " + name + ", \"arguments\":"
		case Llama3Format:
			return "{\"name\": " + name + ", \"parameters\":"
		}
	}
	return ""
}

// ArgumentsSchema is the JSON schema of a call of t's arguments: its parameters schema, or
// any object when it gives none. It is the seam for constrained decoding of forced calls:
// today a forced call's arguments are sampled freely (and a call whose arguments do not
// parse comes back as text).
func ArgumentsSchema(t Tool) json.RawMessage {
	if len(t.Parameters) > 0 {
		return t.Parameters
	}
	return json.RawMessage(`{"type":"object"}`)
}

func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimSpace(b.Bytes())
}

// ParseToolCalls splits a model's answer into text and the calls of tools it made, in
// format f. A call that does not parse, or names a tool not offered, stays in the text as
// it was written; at most max calls are taken (0: any number), the rest stay text. It
// never fails.
func ParseToolCalls(f ToolFormat, text string, tools []Tool, max int) (content string, calls []ToolCall) {
	known := map[string]*Tool{}
	for i := range tools {
		known[tools[i].Name] = &tools[i]
	}
	full := func() bool { return max > 0 && len(calls) >= max }
	switch f {
	case HermesFormat:
		var out strings.Builder
		rest := text
		for {
			i := strings.Index(rest, hermesOpen)
			if i < 0 || full() {
				out.WriteString(rest)
				break
			}
			body := rest[i+len(hermesOpen):]
			j := strings.Index(body, hermesClose)
			end := len(body) // an unterminated last call (the answer ended in it)
			if j >= 0 {
				end = j
			}
			call, ok := parseCall(body[:end], known, "arguments")
			if !ok {
				out.WriteString(rest[:i+len(hermesOpen)])
				rest = body
				continue
			}
			calls = append(calls, call)
			out.WriteString(rest[:i])
			if j < 0 {
				rest = ""
			} else {
				rest = body[j+len(hermesClose):]
			}
		}
		content = out.String()
		if len(calls) > 0 && strings.TrimSpace(content) == "" {
			content = ""
		}
		return content, calls
	case Llama3Format:
		body := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), pythonTag))
		if !strings.HasPrefix(body, "{") {
			return text, nil
		}
		var parsed []ToolCall
		dec := json.NewDecoder(strings.NewReader(body))
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return text, nil
			}
			call, ok := parseCall(string(raw), known, "parameters", "arguments")
			if !ok {
				return text, nil
			}
			parsed = append(parsed, call)
			rest := strings.TrimSpace(body[dec.InputOffset():])
			if rest == "" {
				break
			}
			if !strings.HasPrefix(rest, ";") {
				return text, nil
			}
			rest = strings.TrimSpace(rest[1:])
			if rest == "" {
				break
			}
			body = rest
			dec = json.NewDecoder(strings.NewReader(body))
		}
		if max > 0 && len(parsed) > max {
			return text, nil // the calls are one JSON text: all of them, or none
		}
		return "", parsed
	}
	return text, nil
}

// parseCall reads {"name": …, <argument key>: {…}}: the arguments an object, or a string
// holding one; a missing argument key is no arguments. The arguments of a strict tool must
// validate against its schema.
func parseCall(s string, known map[string]*Tool, argKeys ...string) (ToolCall, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(strings.TrimSpace(s)), &obj) != nil {
		return ToolCall{}, false
	}
	var name string
	if json.Unmarshal(obj["name"], &name) != nil || known[name] == nil {
		return ToolCall{}, false
	}
	args := json.RawMessage("{}")
	for _, k := range argKeys {
		raw, ok := obj[k]
		if !ok {
			continue
		}
		var str string
		if json.Unmarshal(raw, &str) == nil {
			raw = json.RawMessage(str)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil || m == nil {
			return ToolCall{}, false
		}
		var compact bytes.Buffer
		if json.Compact(&compact, raw) != nil {
			return ToolCall{}, false
		}
		args = compact.Bytes()
		break
	}
	if !known[name].validArguments(args) {
		return ToolCall{}, false
	}
	return ToolCall{Name: name, Arguments: args}, true
}

// ToolSplitter streams a choice's text while its tool calls are parsed: Feed returns the
// text that is surely not part of a call (it holds back anything from a call's opening on,
// and an end of text that may start one); Finish parses the whole answer and returns the
// text not returned yet and the calls. The text Feed returned is always the start of
// Finish's content, so the streamed text and the final content agree.
type ToolSplitter struct {
	f     ToolFormat
	tools []Tool
	max   int
	text  strings.Builder
	sent  int
	held  bool // a call may have started: nothing more is streamed
}

// NewToolSplitter returns a splitter for format f; prefix is the forced start of the
// answer (ForcedPrefix), which is part of the text parsed.
func NewToolSplitter(f ToolFormat, tools []Tool, max int, prefix string) *ToolSplitter {
	s := &ToolSplitter{f: f, tools: tools, max: max}
	s.text.WriteString(prefix)
	if prefix != "" {
		s.held = true
	}
	return s
}

// Feed adds new text and returns the part that can be sent as text now.
func (s *ToolSplitter) Feed(chunk string) string {
	s.text.WriteString(chunk)
	if s.held {
		return ""
	}
	all := s.text.String()
	safe := len(all)
	switch s.f {
	case HermesFormat:
		if i := strings.Index(all, hermesOpen); i >= 0 {
			safe, s.held = i, true
		} else {
			for k := min(len(hermesOpen)-1, len(all)); k > 0; k-- {
				if strings.HasSuffix(all, hermesOpen[:k]) {
					safe = len(all) - k
					break
				}
			}
		}
	case Llama3Format:
		t := strings.TrimLeft(all, " \t\r\n")
		if t == "" {
			safe = 0
		} else if strings.HasPrefix(t, "{") || strings.HasPrefix(t, pythonTag) || strings.HasPrefix(pythonTag, t) {
			safe, s.held = 0, true
		}
	}
	safe = max(safe, s.sent)
	out := all[s.sent:safe]
	s.sent = safe
	return out
}

// Finish parses the whole answer: the text not sent yet, and the calls.
func (s *ToolSplitter) Finish() (rest string, calls []ToolCall) {
	all := s.text.String()
	content, calls := ParseToolCalls(s.f, all, s.tools, s.max)
	if len(calls) == 0 {
		content = all
	}
	if strings.HasPrefix(content, all[:s.sent]) {
		return content[s.sent:], calls
	}
	// The parse trimmed text that was sent (white space before a call): send no more.
	return "", calls
}
