package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	conformancev1 "github.com/loops-dev/loops/gen/go/loops/conformance/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

var reference = regexp.MustCompile(`\$\{([^}]*)\}`)

// scope holds what references resolve to while one case runs on one surface.
type scope struct {
	fixed    map[string]string
	captures map[string]map[string]string
	docs     map[string]any
}

func newScope(fixed map[string]string) *scope {
	return &scope{fixed: fixed, captures: map[string]map[string]string{}, docs: map[string]any{}}
}

// expand replaces every ${…} in s.
func (sc *scope) expand(s string) (string, error) {
	var firstErr error
	out := reference.ReplaceAllStringFunc(s, func(m string) string {
		v, err := sc.resolve(m[2 : len(m)-1])
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return v
	})
	return out, firstErr
}

func (sc *scope) resolve(ref string) (string, error) {
	if v, ok := sc.fixed[ref]; ok {
		return v, nil
	}
	if fn, args, ok := strings.Cut(ref, ":"); ok {
		return encodeValues(fn, args)
	}
	step, name, ok := strings.Cut(ref, ".")
	if !ok {
		return "", fmt.Errorf("unknown reference ${%s}", ref)
	}
	if v, ok := sc.captures[step][name]; ok {
		return v, nil
	}
	doc, ok := sc.docs[step]
	if !ok {
		return "", fmt.Errorf("reference ${%s}: no earlier step has id %q", ref, step)
	}
	v, ok := lookup(doc, name)
	if !ok {
		return "", fmt.Errorf("reference ${%s}: step %q's response has no %q", ref, step, name)
	}
	return valueText(v), nil
}

// encodeValues implements ${i32le:…}, ${i64le:…}, ${f32le:…} and ${pad:N}.
func encodeValues(fn, args string) (string, error) {
	if fn == "pad" {
		n, err := strconv.Atoi(args)
		if err != nil || n < 0 || n > 1<<30 {
			return "", fmt.Errorf("${pad:%s}: want a byte count", args)
		}
		return strings.Repeat("a", n), nil
	}
	var buf bytes.Buffer
	for _, a := range strings.Split(args, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		switch fn {
		case "i32le":
			v, err := strconv.ParseInt(a, 10, 32)
			if err != nil {
				return "", fmt.Errorf("${i32le:…}: %w", err)
			}
			_ = binary.Write(&buf, binary.LittleEndian, int32(v))
		case "i64le":
			v, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				return "", fmt.Errorf("${i64le:…}: %w", err)
			}
			_ = binary.Write(&buf, binary.LittleEndian, v)
		case "f32le":
			v, err := strconv.ParseFloat(a, 32)
			if err != nil && a != "nan" {
				return "", fmt.Errorf("${f32le:…}: %w", err)
			}
			if a == "nan" {
				v = math.NaN()
			}
			_ = binary.Write(&buf, binary.LittleEndian, float32(v))
		default:
			return "", fmt.Errorf("unknown encoder ${%s:…}: use i32le, i64le, f32le or pad", fn)
		}
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// expandValue returns a copy of v with every string expanded.
func (sc *scope) expandValue(v *structpb.Value) (*structpb.Value, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		s, err := sc.expand(k.StringValue)
		return structpb.NewStringValue(s), err
	case *structpb.Value_StructValue:
		s, err := sc.expandStruct(k.StructValue)
		return structpb.NewStructValue(s), err
	case *structpb.Value_ListValue:
		out := &structpb.ListValue{}
		for _, e := range k.ListValue.GetValues() {
			x, err := sc.expandValue(e)
			if err != nil {
				return nil, err
			}
			out.Values = append(out.Values, x)
		}
		return structpb.NewListValue(out), nil
	default:
		return v, nil
	}
}

func (sc *scope) expandStruct(s *structpb.Struct) (*structpb.Struct, error) {
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range s.GetFields() {
		x, err := sc.expandValue(v)
		if err != nil {
			return nil, err
		}
		out.Fields[k] = x
	}
	return out, nil
}

// record keeps a step's response document and its captures.
func (sc *scope) record(id string, doc any, capture map[string]string) error {
	if id == "" {
		return nil
	}
	sc.docs[id] = doc
	got := map[string]string{}
	for name, p := range capture {
		v, ok := lookup(doc, p)
		if !ok || valueText(v) == "" {
			return fmt.Errorf("capture %s.%s: the response has no %q", id, name, p)
		}
		got[name] = valueText(v)
	}
	sc.captures[id] = got
	return nil
}

// decodeDoc parses JSON keeping numbers exact.
func decodeDoc(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// lookup follows a Check path through a JSON document.
func lookup(doc any, path string) (any, bool) {
	if path == "" || path == "." {
		return doc, true
	}
	segs := strings.Split(path, ".")
	cur := doc
	for i, seg := range segs {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[seg]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			if seg == "#" {
				if i == len(segs)-1 {
					return json.Number(strconv.Itoa(len(c))), true
				}
				rest := strings.Join(segs[i+1:], ".")
				out := []any{}
				for _, e := range c {
					if v, ok := lookup(e, rest); ok {
						out = append(out, v)
					}
				}
				return out, true
			}
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(c) {
				return nil, false
			}
			cur = c[n]
		default:
			return nil, false
		}
	}
	return cur, true
}

// valueText is a JSON value as text: strings unquoted, null empty.
func valueText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// checkDoc applies checks to a document; the error names the first that fails.
func (sc *scope) checkDoc(doc any, checks []*conformancev1.Check) error {
	for _, c := range checks {
		v, found := lookup(doc, c.GetPath())
		switch w := c.GetWant().(type) {
		case *conformancev1.Check_Equals:
			want, err := sc.expand(w.Equals)
			if err != nil {
				return err
			}
			if !found || valueText(v) != want {
				return fmt.Errorf("check %s: got %s, want %q", c.GetPath(), describe(v, found), want)
			}
		case *conformancev1.Check_Contains:
			want, err := sc.expand(w.Contains)
			if err != nil {
				return err
			}
			if !found || !containsValue(v, want) {
				return fmt.Errorf("check %s: got %s, want it to contain %q", c.GetPath(), describe(v, found), want)
			}
		case *conformancev1.Check_Excludes:
			want, err := sc.expand(w.Excludes)
			if err != nil {
				return err
			}
			if found && containsValue(v, want) {
				return fmt.Errorf("check %s: got %s, want it not to contain %q", c.GetPath(), describe(v, found), want)
			}
		case *conformancev1.Check_Present:
			if found && !isEmpty(v) != w.Present {
				return fmt.Errorf("check %s: got %s, want present=%v", c.GetPath(), describe(v, found), w.Present)
			}
			if !found && w.Present {
				return fmt.Errorf("check %s: missing, want it present", c.GetPath())
			}
		case *conformancev1.Check_AtLeast:
			n, ok := v.(json.Number)
			f, err := n.Float64()
			if !found || !ok || err != nil || f < w.AtLeast {
				return fmt.Errorf("check %s: got %s, want a number >= %v", c.GetPath(), describe(v, found), w.AtLeast)
			}
		default:
			return fmt.Errorf("check %s: no expectation (equals, contains, excludes, present or at_least)", c.GetPath())
		}
	}
	return nil
}

func describe(v any, found bool) string {
	if !found {
		return "nothing"
	}
	s := valueText(v)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strconv.Quote(s)
}

func containsValue(v any, want string) bool {
	switch x := v.(type) {
	case string:
		return strings.Contains(x, want)
	case []any:
		for _, e := range x {
			if valueText(e) == want {
				return true
			}
		}
	}
	return false
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}
