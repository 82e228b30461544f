package constrain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits of what a schema may ask for.
const (
	// MaxSchemaBytes bounds a schema's JSON text.
	MaxSchemaBytes = 64 << 10
	// MaxSchemaDepth bounds how deep a schema's objects and arrays nest (counting $ref
	// expansions).
	MaxSchemaDepth = 12
	// MaxRefExpansions is how many times one $ref may appear on the path from the root: a
	// recursive definition is unrolled that many times, after which the recursive branch
	// is not taken (a schema whose recursion cannot end there admits nothing: refused).
	MaxRefExpansions = 3
	// MaxItemsUnrolled bounds minItems and maxItems (each item up to maxItems is a copy of
	// the item's automaton).
	MaxItemsUnrolled = 32
	// JSONObjectDepth is how many objects and arrays json_object output nests, the top
	// object included.
	JSONObjectDepth = 5
	// anyDepth is how deep a value the schema leaves open ({} or true) may nest.
	anyDepth = 3
	// maxNFAStates bounds the byte automaton before determinisation.
	maxNFAStates = 1 << 17
)

// errTooLarge is wrapped in the error of a schema whose automaton passes the limits.
var errTooLarge = errors.New("the schema's automaton is over Loops' size limit")

// Error is a schema Loops refuses: Keyword names what is wrong (a JSON Schema keyword, or
// "schema"), Path where (a JSON pointer into the schema).
type Error struct {
	Keyword string
	Path    string
	Msg     string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return fmt.Sprintf("%s (at %s)", e.Msg, e.Path)
}

func schemaErr(keyword, path, format string, args ...any) error {
	if path == "" {
		path = "#"
	}
	return &Error{Keyword: keyword, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// annotations are keywords that describe and never constrain: accepted and ignored.
var annotations = map[string]bool{
	"title": true, "description": true, "$schema": true, "$id": true, "$comment": true,
	"default": true, "examples": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true,
}

// structural are the keywords Loops enforces.
var structural = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "enum": true, "const": true,
	"anyOf": true, "$ref": true,
}

// compiler turns a schema into an automaton fragment.
type compiler struct {
	n        *nfa
	root     json.RawMessage
	refs     map[string]int // $ref → times on the current path
	deadline time.Time
}

func (c *compiler) check() error {
	if c.n.err != nil {
		return c.n.err
	}
	if time.Now().After(c.deadline) {
		return errTooLarge
	}
	return nil
}

// object decodes raw as a JSON object.
func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// orderedKeys is the keys of a JSON object in the order they appear.
func orderedKeys(raw json.RawMessage) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := t.(string)
		if slices.Contains(keys, k) {
			return nil, fmt.Errorf("property %q is given twice", k)
		}
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

func ptr(path, key string) string {
	key = strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
	return path + "/" + key
}

// value compiles the schema raw at path, nested depth deep.
func (c *compiler) value(raw json.RawMessage, path string, depth int) (frag, error) {
	if err := c.check(); err != nil {
		return frag{}, err
	}
	if depth > MaxSchemaDepth {
		return frag{}, schemaErr("schema", path, "the schema nests more than %d levels deep", MaxSchemaDepth)
	}
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "true":
		return c.n.jsonAny(anyDepth), nil
	case "false":
		return c.n.empty(), nil
	}
	s, ok := object(raw)
	if !ok {
		return frag{}, schemaErr("schema", path, "a schema must be a JSON object (or true or false)")
	}
	for _, k := range sortedKeys(s) {
		if !annotations[k] && !structural[k] {
			return frag{}, schemaErr(k, path, "JSON Schema keyword %q is not supported by Loops' structured outputs (supported: %s)", k, supportedList())
		}
	}
	if ref, ok := s["$ref"]; ok {
		for k := range s {
			if structural[k] && k != "$ref" {
				return frag{}, schemaErr(k, path, "%q beside $ref is not supported: move it into the definition", k)
			}
		}
		return c.ref(ref, path, depth)
	}
	if any, ok := s["anyOf"]; ok {
		for k := range s {
			if structural[k] && k != "anyOf" {
				return frag{}, schemaErr(k, path, "%q beside anyOf is not supported: move it into each branch", k)
			}
		}
		var branches []json.RawMessage
		if json.Unmarshal(any, &branches) != nil || len(branches) == 0 {
			return frag{}, schemaErr("anyOf", path, "anyOf must be a non-empty list of schemas")
		}
		alts := make([]frag, len(branches))
		for i, b := range branches {
			f, err := c.value(b, ptr(ptr(path, "anyOf"), strconv.Itoa(i)), depth+1)
			if err != nil {
				return frag{}, err
			}
			alts[i] = f
		}
		return c.n.alt(alts...), nil
	}
	types, err := typesOf(s, path)
	if err != nil {
		return frag{}, err
	}
	if raw, ok := s["const"]; ok {
		return c.literals([]json.RawMessage{raw}, types, path, "const")
	}
	if raw, ok := s["enum"]; ok {
		var vals []json.RawMessage
		if json.Unmarshal(raw, &vals) != nil || len(vals) == 0 {
			return frag{}, schemaErr("enum", path, "enum must be a non-empty list")
		}
		return c.literals(vals, types, path, "enum")
	}
	if types == nil {
		switch {
		case s["properties"] != nil || s["required"] != nil || s["additionalProperties"] != nil:
			types = []string{"object"}
		case s["items"] != nil || s["minItems"] != nil || s["maxItems"] != nil:
			types = []string{"array"}
		default:
			return c.n.jsonAny(anyDepth), nil
		}
	}
	alts := make([]frag, 0, len(types))
	for _, t := range types {
		var f frag
		switch t {
		case "string":
			f = c.n.jsonString()
		case "number":
			f = c.n.jsonNumber()
		case "integer":
			f = c.n.jsonInteger()
		case "boolean":
			f = c.n.alt(c.n.lit("true"), c.n.lit("false"))
		case "null":
			f = c.n.lit("null")
		case "object":
			if f, err = c.object(s, path, depth); err != nil {
				return frag{}, err
			}
		case "array":
			if f, err = c.array(s, path, depth); err != nil {
				return frag{}, err
			}
		}
		alts = append(alts, f)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.n.alt(alts...), nil
}

func supportedList() string {
	return "type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, $ref with $defs or definitions"
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var jsonTypes = []string{"string", "number", "integer", "boolean", "null", "object", "array"}

// typesOf reads "type": nil when absent.
func typesOf(s map[string]json.RawMessage, path string) ([]string, error) {
	raw, ok := s["type"]
	if !ok {
		return nil, nil
	}
	var one string
	var many []string
	switch {
	case json.Unmarshal(raw, &one) == nil:
		many = []string{one}
	case json.Unmarshal(raw, &many) == nil && len(many) > 0:
	default:
		return nil, schemaErr("type", path, "type must be a type name or a non-empty list of them")
	}
	for _, t := range many {
		if !slices.Contains(jsonTypes, t) {
			return nil, schemaErr("type", path, "type %q is not a JSON Schema type (%s)", truncate(t), strings.Join(jsonTypes, ", "))
		}
	}
	slices.Sort(many)
	return slices.Compact(many), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// typeOfValue is the JSON Schema types a JSON value has.
func typeOfValue(v any) []string {
	switch x := v.(type) {
	case nil:
		return []string{"null"}
	case bool:
		return []string{"boolean"}
	case string:
		return []string{"string"}
	case json.Number:
		if f, err := x.Float64(); err == nil && f == float64(int64(f)) {
			return []string{"number", "integer"}
		}
		return []string{"number"}
	case []any:
		return []string{"array"}
	case map[string]any:
		return []string{"object"}
	}
	return nil
}

// literals accepts exactly the given values, each written as compact JSON.
func (c *compiler) literals(vals []json.RawMessage, types []string, path, keyword string) (frag, error) {
	var alts []frag
	seen := map[string]bool{}
	for i, raw := range vals {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return frag{}, schemaErr(keyword, path, "%s[%d] is not JSON", keyword, i)
		}
		if types != nil && !slices.ContainsFunc(typeOfValue(v), func(t string) bool { return slices.Contains(types, t) }) {
			continue // the type excludes it
		}
		b, err := json.Marshal(v)
		if err != nil {
			return frag{}, schemaErr(keyword, path, "%s[%d] cannot be written as JSON: %v", keyword, i, err)
		}
		if seen[string(b)] {
			continue
		}
		seen[string(b)] = true
		alts = append(alts, c.n.lit(string(b)))
	}
	if len(alts) == 0 {
		return frag{}, schemaErr(keyword, path, "no value of %s has the schema's type", keyword)
	}
	return c.n.alt(alts...), nil
}

// ref compiles a $ref: "#", "#/$defs/<name>" or "#/definitions/<name>" of the root schema.
func (c *compiler) ref(raw json.RawMessage, path string, depth int) (frag, error) {
	var ref string
	if json.Unmarshal(raw, &ref) != nil {
		return frag{}, schemaErr("$ref", path, "$ref must be a string")
	}
	if c.refs[ref] >= MaxRefExpansions {
		return c.n.empty(), nil // the recursion stops here: this branch is not taken
	}
	target := c.root
	if ref != "#" {
		rest, ok := strings.CutPrefix(ref, "#/")
		if !ok {
			return frag{}, schemaErr("$ref", path, "$ref %q is not supported: only references into this schema (#, #/$defs/…, #/definitions/…)", truncate(ref))
		}
		for _, part := range strings.Split(rest, "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			m, ok := object(target)
			if !ok || m[part] == nil {
				return frag{}, schemaErr("$ref", path, "$ref %q points at nothing in the schema", truncate(ref))
			}
			target = m[part]
		}
	}
	c.refs[ref]++
	defer func() { c.refs[ref]-- }()
	return c.value(target, ref, depth+1)
}

// object compiles an object schema: its properties in the schema's order, the required
// ones always and the others optionally; no other properties (additionalProperties other
// than false is accepted, and the output simply has none). Without properties and with
// additionalProperties not false: any object.
func (c *compiler) object(s map[string]json.RawMessage, path string, depth int) (frag, error) {
	var props map[string]json.RawMessage
	var order []string
	if raw, ok := s["properties"]; ok {
		var ok2 bool
		if props, ok2 = object(raw); !ok2 {
			return frag{}, schemaErr("properties", path, "properties must be an object of schemas")
		}
		var err error
		if order, err = orderedKeys(raw); err != nil {
			return frag{}, schemaErr("properties", path, "properties: %v", err)
		}
	}
	var required []string
	if raw, ok := s["required"]; ok {
		if json.Unmarshal(raw, &required) != nil {
			return frag{}, schemaErr("required", path, "required must be a list of property names")
		}
	}
	for _, r := range required {
		if _, ok := props[r]; !ok {
			return frag{}, schemaErr("required", path, "required property %q has no schema in properties: add it to properties", truncate(r))
		}
	}
	closed := false
	if raw, ok := s["additionalProperties"]; ok {
		switch string(bytes.TrimSpace(raw)) {
		case "false":
			closed = true
		case "true":
		default:
			if _, ok := object(raw); !ok {
				return frag{}, schemaErr("additionalProperties", path, "additionalProperties must be a boolean or a schema")
			}
			// a schema: only the declared properties are written, so it is never used
		}
	}
	n := c.n
	if len(order) == 0 {
		if closed {
			return n.lit("{}"), nil
		}
		return n.jsonAnyObject(anyDepth), nil
	}
	// States: before property i with nothing written yet (empty[i]) or with something
	// written (some[i]); a property leaves from either, with a comma from some[i].
	open := n.lit("{")
	empty := make([]int32, len(order)+1)
	some := make([]int32, len(order)+1)
	for i := range empty {
		empty[i], some[i] = n.add(), n.add()
	}
	n.eps(open.end, empty[0])
	for i, name := range order {
		key, _ := json.Marshal(name)
		v, err := c.value(props[name], ptr(ptr(path, "properties"), name), depth+1)
		if err != nil {
			return frag{}, err
		}
		first := n.lit(string(key) + ":")
		next := n.lit("," + string(key) + ":")
		n.eps(empty[i], first.start)
		n.eps(some[i], next.start)
		n.eps(first.end, v.start)
		n.eps(next.end, v.start)
		n.eps(v.end, some[i+1])
		if !slices.Contains(required, name) {
			n.eps(empty[i], empty[i+1])
			n.eps(some[i], some[i+1])
		}
	}
	end := n.lit("}")
	n.eps(empty[len(order)], end.start)
	n.eps(some[len(order)], end.start)
	return frag{open.start, end.end}, nil
}

// array compiles an array schema: items (any value when absent), minItems, maxItems.
func (c *compiler) array(s map[string]json.RawMessage, path string, depth int) (frag, error) {
	item := json.RawMessage("true")
	if raw, ok := s["items"]; ok {
		item = raw
	}
	bound := func(k string) (int, bool, error) {
		raw, ok := s[k]
		if !ok {
			return 0, false, nil
		}
		var v float64
		if json.Unmarshal(raw, &v) != nil || v < 0 || v != float64(int(v)) {
			return 0, false, schemaErr(k, path, "%s must be a non-negative integer", k)
		}
		if v > MaxItemsUnrolled {
			return 0, false, schemaErr(k, path, "%s %v is over Loops' limit of %d", k, v, MaxItemsUnrolled)
		}
		return int(v), true, nil
	}
	lo, _, err := bound("minItems")
	if err != nil {
		return frag{}, err
	}
	hi, hasHi, err := bound("maxItems")
	if err != nil {
		return frag{}, err
	}
	if !hasHi {
		hi = -1
	} else if hi < lo {
		return frag{}, schemaErr("maxItems", path, "maxItems %d is below minItems %d", hi, lo)
	}
	n := c.n
	mk := func() (frag, error) { return c.value(item, ptr(path, "items"), depth+1) }
	if lo == 0 && hi < 0 {
		var ierr error
		f := n.list("[", "]", func() frag {
			var f frag
			f, ierr = mk()
			return f
		})
		return f, ierr
	}
	if hi == 0 {
		return n.lit("[]"), nil
	}
	// [ item (, item){lo-1 .. hi-1} ] or [] when lo is 0
	var ierr error
	mkItem := func() frag {
		f, err := mk()
		if err != nil && ierr == nil {
			ierr = err
		}
		return f
	}
	first := mkItem()
	more := n.upTo(max(lo-1, 0), max(hi-1, -1), func() frag { return n.seq(n.lit(","), mkItem()) })
	nonEmpty := n.seq(n.lit("["), first, more, n.lit("]"))
	if ierr != nil {
		return frag{}, ierr
	}
	if lo == 0 {
		return n.alt(n.lit("[]"), nonEmpty), nil
	}
	return nonEmpty, nil
}
