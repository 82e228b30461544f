package constrain_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/constrain"
	"github.com/loops-dev/loops/internal/constrain/constraintest"
)

// accepts runs text through a from its start.
func accepts(a *constrain.Automaton, text string) (prefix, complete bool) {
	s := a.Start()
	for i := 0; i < len(text); i++ {
		if s = a.Step(s, text[i]); s == constrain.Dead {
			return false, false
		}
	}
	return true, a.Accepts(s)
}

// walk draws a random text of a's language: at each state a random byte among those that
// stay live (one class at a time, so a string's body is no likelier than its end), ending
// with probability 1/3 where the text is complete. ok is false past limit bytes.
func walk(a *constrain.Automaton, r *rand.Rand, limit int) (string, bool) {
	var out []byte
	s := a.Start()
	for len(out) < limit {
		var next []byte
		seen := map[int32]bool{}
		for b := range 256 {
			if t := a.Step(s, byte(b)); t != constrain.Dead && !seen[t] {
				seen[t] = true
				next = append(next, byte(b))
			}
		}
		if a.Accepts(s) && (len(next) == 0 || r.IntN(3) == 0) {
			return string(out), true
		}
		b := next[r.IntN(len(next))]
		out = append(out, b)
		s = a.Step(s, b)
	}
	return string(out), false
}

func validator(t testing.TB, schema []byte) *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("schema.json", doc))
	sch, err := c.Compile("schema.json")
	require.NoError(t, err, string(schema))
	return sch
}

func validates(t testing.TB, sch *jsonschema.Schema, text string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return fmt.Errorf("%q does not parse: %w", text, err)
	}
	return sch.Validate(inst)
}

func TestJSONObject(t *testing.T) {
	a := constrain.JSONObject()
	for _, ok := range []string{`{}`, `{"a":1}`, `{"a":[1,2.5e-3,{"b":null}],"c":"x\"\u00e9é"}`, `{"a":{"b":{"c":{"d":{"e":1}}}}}`} {
		_, complete := accepts(a, ok)
		require.True(t, complete, ok)
	}
	for _, bad := range []string{`[]`, `{"a":1,}`, `{"a" :1}`, `{"a":01}`, `{"a":"\x01"}`, "{\"a\":\"\xff\"}", `{"a":{"b":{"c":{"d":{"e":{"f":1}}}}}}`, `{} `} {
		prefix, complete := accepts(a, bad)
		require.False(t, prefix && complete, bad)
	}
	prefix, complete := accepts(a, `{"a":[1,`)
	require.True(t, prefix)
	require.False(t, complete)
}

func TestSchemaAcceptsAndRefuses(t *testing.T) {
	schema := []byte(`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"opt":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["name","age","tags"],"additionalProperties":false}`)
	a, err := constrain.Schema(schema)
	require.NoError(t, err)
	for _, ok := range []string{`{"name":"x","age":-3,"tags":[]}`, `{"name":"","age":0,"opt":true,"tags":["a","b"]}`} {
		_, complete := accepts(a, ok)
		require.True(t, complete, ok)
	}
	for _, bad := range []string{`{"age":1,"name":"x","tags":[]}`, `{"name":"x","tags":[]}`, `{"name":"x","age":1.5,"tags":[]}`, `{"name":"x","age":1,"tags":["c"]}`, `{"name":"x","age":1,"tags":["a","a","a"]}`, `{"name":"x","age":1,"tags":[],"z":1}`} {
		_, complete := accepts(a, bad)
		require.False(t, complete, bad)
	}
}

func TestUnsupportedKeywords(t *testing.T) {
	for kw, schema := range map[string]string{
		"pattern":   `{"type":"string","pattern":"a+"}`,
		"minimum":   `{"type":"object","properties":{"n":{"type":"integer","minimum":3}},"required":["n"]}`,
		"oneOf":     `{"oneOf":[{"type":"string"}]}`,
		"allOf":     `{"allOf":[{"type":"string"}]}`,
		"$ref":      `{"$ref":"https://example.com/s.json"}`,
		"type":      `{"type":"date"}`,
		"required":  `{"type":"object","properties":{},"required":["x"]}`,
		"maxItems":  `{"type":"array","maxItems":1000}`,
		"schema":    `[1]`,
		"enum":      `{"type":"string","enum":[1,2]}`,
		"anyOf":     `{"anyOf":[]}`,
		"minLength": `{"type":"string","minLength":3}`,
	} {
		_, err := constrain.Schema([]byte(schema))
		var se *constrain.Error
		require.ErrorAs(t, err, &se, kw)
		require.Equal(t, kw, se.Keyword, err.Error())
	}
}

func TestSchemaTooLarge(t *testing.T) {
	// arrays of arrays with bounded items multiply: refused by the state limit
	s := `{"type":"integer"}`
	for range 6 {
		s = `{"type":"array","items":` + s + `,"minItems":20,"maxItems":30}`
	}
	_, err := constrain.Schema([]byte(s))
	var se *constrain.Error
	require.ErrorAs(t, err, &se)
	require.Contains(t, err.Error(), "too large")
	// a recursion that cannot end
	_, err = constrain.Schema([]byte(`{"$defs":{"n":{"type":"object","properties":{"k":{"$ref":"#/$defs/n"}},"required":["k"]}},"$ref":"#/$defs/n"}`))
	require.ErrorAs(t, err, &se)
	require.Contains(t, err.Error(), "admits no value")
}

// TestRandomSchemasValidate is the byte-level property test: for random schemas of the
// supported subset, random texts of the automaton's language validate against the schema
// (with an independent validator, santhosh-tekuri/jsonschema).
func TestRandomSchemasValidate(t *testing.T) {
	for seed := range uint64(150) {
		r := rand.New(rand.NewPCG(seed, 7))
		schema := constraintest.Schema(r, 3)
		a, err := constrain.Schema(schema)
		require.NoError(t, err, string(schema))
		sch := validator(t, schema)
		for range 20 {
			text, ok := walk(a, r, 4000)
			if !ok {
				continue
			}
			require.NoError(t, validates(t, sch, text), "schema %s\ntext %s", schema, text)
		}
	}
}

// TestMaskMatchesBruteForce checks Tokens.Mask against trying every token's bytes.
func TestMaskMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var toks [][]byte
	alphabet := []byte(`{}[]":,0123456789-.eEtrufalsn \abxyz` + "\xc3\xa9\xff")
	for range 400 {
		b := make([]byte, 1+r.IntN(4))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		toks = append(toks, b)
	}
	toks = append(toks, nil) // a special token: the end of sequence
	eos := len(toks) - 1
	v := constrain.NewVocab(len(toks)+3, func(id int) []byte {
		if id < len(toks) {
			return toks[id]
		}
		return nil
	}, []int{eos})
	a, err := constrain.Schema([]byte(`{"type":"object","properties":{"a":{"type":"array","items":{"type":"number"}},"b":{"enum":["x","é"]}},"required":["a"]}`))
	require.NoError(t, err)
	tk := constrain.ForVocab(a, v)
	s := tk.Start()
	for step := 0; step < 40; step++ {
		m := tk.Mask(s)
		var allowed []int
		for id := range v.Size() {
			want := tk.Next(s, id) != constrain.Dead
			got := m[id/64]>>(id%64)&1 == 1
			require.Equal(t, want, got, "token %d %q at step %d", id, v.Size(), step)
			if want {
				allowed = append(allowed, id)
			}
		}
		require.NotEmpty(t, allowed)
		tok := allowed[r.IntN(len(allowed))]
		if tok == eos {
			require.True(t, tk.Accepts(s))
			break
		}
		s = tk.Next(s, tok)
	}
}

func TestSchemaErrorIsTyped(t *testing.T) {
	_, err := constrain.Schema([]byte(`not json`))
	var se *constrain.Error
	require.True(t, errors.As(err, &se))
	require.Equal(t, "schema", se.Keyword)
}

func FuzzSchema(f *testing.F) {
	f.Add([]byte(`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}`))
	f.Add([]byte(`{"anyOf":[{"type":"integer"},{"type":"array","items":{"$ref":"#"},"maxItems":2}]}`))
	f.Add([]byte(`{"enum":[1,"a",null,{"k":[true]}]}`))
	f.Add([]byte(`{"type":["number","null"]}`))
	for seed := range uint64(4) {
		f.Add(constraintest.Schema(rand.New(rand.NewPCG(seed, 9)), 2))
	}
	f.Fuzz(func(t *testing.T, schema []byte) {
		a, err := constrain.Schema(schema)
		if err != nil {
			var se *constrain.Error
			require.ErrorAs(t, err, &se)
			return
		}
		require.Positive(t, a.States())
		require.LessOrEqual(t, a.States(), constrain.MaxStates)
		// every text of the language is JSON (a schema the validator does not take, say a
		// draft it does not know, is checked for that alone)
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		require.NoError(t, err)
		c := jsonschema.NewCompiler()
		var sch *jsonschema.Schema
		if c.AddResource("schema.json", doc) == nil {
			sch, _ = c.Compile("schema.json")
		}
		r := rand.New(rand.NewPCG(uint64(len(schema)), 3))
		for range 3 {
			text, ok := walk(a, r, 2000)
			if !ok {
				continue
			}
			require.True(t, json.Valid([]byte(text)), text)
			if sch != nil {
				require.NoError(t, validates(t, sch, text), "schema %s\ntext %s", schema, text)
			}
		}
	})
}
