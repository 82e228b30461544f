package infer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// The chat template sees a request's JSON (tool definitions, tool call arguments) as
// transformers' apply_chat_template does: objects as dicts, and `tojson` writing them as
// Python's json.dumps does (", " and ": " separators, non-ASCII kept, the keys in the order
// the client sent them). Objects are Go maps (every gonja filter and method takes them); the
// order of their keys is remembered beside them, by the map's identity, for as long as the
// render that made them runs.

// keyOrders maps a template map (its pointer) to its keys in the client's order, while the
// render that made it runs (templateValues registers, its release forgets).
var keyOrders sync.Map

// templateValues turns JSON into template values (objects: map[string]any; arrays: []any;
// integers: int64; other numbers: float64), remembering each object's key order until
// release is called.
type templateValues struct{ maps []uintptr }

func (tv *templateValues) release() {
	for _, p := range tv.maps {
		keyOrders.Delete(p)
	}
	tv.maps = nil
}

// value decodes raw (valid JSON) into a template value.
func (tv *templateValues) value(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := tv.decode(dec)
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (tv *templateValues) decode(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			var keys []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := tv.decode(dec)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					keys = append(keys, k)
				}
				m[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			p := reflect.ValueOf(m).Pointer()
			keyOrders.Store(p, keys)
			tv.maps = append(tv.maps, p)
			return m, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := tv.decode(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return list, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	return tok, nil // string, bool, nil
}

// templateEnvironment is gonja's default environment with transformers' tojson.
var templateEnvironment = func() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		panic(err)
	}
	env := *gonja.DefaultEnvironment
	env.Filters = filters
	return &env
}()

// filterToJSON is transformers' tojson filter: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys).
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	indent, sortKeys := -1, false
	for k, v := range params.KwArgs {
		switch k {
		case "indent":
			if !v.IsNil() {
				if !v.IsInteger() {
					return exec.AsValue(fmt.Errorf("tojson: indent must be an integer, got %s", v.String()))
				}
				indent = v.Integer()
			}
		case "sort_keys":
			sortKeys = v.IsTrue()
		case "ensure_ascii", "separators":
			// ensure_ascii=True is not what transformers passes by default; separators keep
			// json.dumps' defaults, which is all chat templates use.
		}
	}
	if len(params.Args) > 0 && params.Args[0].IsInteger() {
		indent = params.Args[0].Integer()
	}
	var b strings.Builder
	if err := writePyJSON(&b, in.Interface(), indent, sortKeys, 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(b.String())
}

// writePyJSON writes v as Python's json.dumps(v, ensure_ascii=False) does, with indent
// (negative: none) and sort_keys.
func writePyJSON(b *strings.Builder, v any, indent int, sortKeys bool, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("tojson: nesting deeper than %d", maxJSONDepth)
	}
	if ev, ok := v.(*exec.Value); ok {
		v = ev.Interface()
	}
	newline := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	itemSep, keySep := ", ", ": "
	if indent >= 0 {
		itemSep = ","
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[t])
	case string:
		writePyString(b, t)
	case int:
		b.WriteString(strconv.Itoa(t))
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case float64:
		b.WriteString(pyFloat(t))
	case map[string]any:
		keys := orderedKeys(t)
		if sortKeys {
			slices.Sort(keys)
		}
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			writePyString(b, k)
			b.WriteString(keySep)
			if err := writePyJSON(b, t[k], indent, sortKeys, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
	case []any:
		if len(t) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			if err := writePyJSON(b, x, indent, sortKeys, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	default:
		// Values a template built itself (a dict literal, a list of strings): through
		// encoding/json, as gonja's own tojson does.
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Slice, reflect.Array:
			list := make([]any, rv.Len())
			for i := range list {
				list[i] = rv.Index(i).Interface()
			}
			return writePyJSON(b, list, indent, sortKeys, depth)
		case reflect.Map:
			m := map[string]any{}
			for _, k := range rv.MapKeys() {
				m[fmt.Sprint(k.Interface())] = rv.MapIndex(k).Interface()
			}
			return writePyJSON(b, m, indent, sortKeys, depth)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32:
			b.WriteString(strconv.FormatInt(rv.Int(), 10))
			return nil
		case reflect.Float32:
			b.WriteString(pyFloat(rv.Float()))
			return nil
		}
		if d, ok := v.(*exec.Dict); ok {
			m := map[string]any{}
			keys := make([]string, 0, len(d.Pairs))
			for _, p := range d.Pairs {
				keys = append(keys, p.Key.String())
				m[p.Key.String()] = p.Value.Interface()
			}
			if sortKeys {
				slices.Sort(keys)
			}
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteString(itemSep)
				}
				newline(depth + 1)
				writePyString(b, k)
				b.WriteString(keySep)
				if err := writePyJSON(b, m[k], indent, sortKeys, depth+1); err != nil {
					return err
				}
			}
			newline(depth)
			b.WriteByte('}')
			return nil
		}
		out, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("tojson: %w", err)
		}
		b.Write(out)
	}
	return nil
}

// maxJSONDepth bounds the nesting tojson writes (tool schemas are checked against it
// before rendering: MaxToolSchemaDepth).
const maxJSONDepth = 64

// orderedKeys is m's keys in the order the client sent them, or sorted for a map the
// request did not make.
func orderedKeys(m map[string]any) []string {
	if k, ok := keyOrders.Load(reflect.ValueOf(m).Pointer()); ok {
		if keys := k.([]string); len(keys) == len(m) {
			return slices.Clone(keys)
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// writePyString writes s as json.dumps(s, ensure_ascii=False) does.
func writePyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}

// pyFloat formats f as Python's repr(float) does (json.dumps' float format).
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a != 0 && (a < 1e-4 || a >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		mant, exp, _ := strings.Cut(s, "e")
		sign := exp[0]
		exp = strings.TrimLeft(exp[1:], "0")
		if len(exp) < 2 {
			exp = strings.Repeat("0", 2-len(exp)) + exp
		}
		return mant + "e" + string(sign) + exp
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
