package constrain

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// CompileTimeout bounds the time one schema may take to compile; past it the schema is
// refused as too large.
const CompileTimeout = 2 * time.Second

// schemaCacheSize bounds the compiled schemas kept (their automata, or why they were
// refused): each is at most MaxStates states.
const schemaCacheSize = 256

type compiled struct {
	a   *Automaton
	err error
}

var (
	schemaCache, _ = lru.New[[32]byte, compiled](schemaCacheSize)
	objectOnce     sync.Once
	objectAuto     *Automaton
)

// JSONObject is the automaton of compact JSON objects nested at most JSONObjectDepth deep
// (response_format json_object).
func JSONObject() *Automaton {
	objectOnce.Do(func() {
		n := &nfa{limit: maxNFAStates}
		f := n.jsonAnyObject(JSONObjectDepth)
		a, err := determinize(n, f.start, f.end, time.Now().Add(time.Minute))
		if err != nil || n.err != nil || a == nil {
			panic(fmt.Sprintf("constrain: the json_object automaton does not compile: %v %v", err, n.err))
		}
		objectAuto = a
	})
	return objectAuto
}

// Schema compiles a JSON Schema (the subset docs/openai.md lists) to the automaton of the
// compact JSON texts that validate against it. Compiled schemas, and refusals, are kept in
// a bounded LRU keyed by the schema's compact text. A schema Loops does not support, or
// whose automaton passes MaxStates or CompileTimeout, is an *Error naming the keyword.
func Schema(schema []byte) (*Automaton, error) {
	if len(schema) > MaxSchemaBytes {
		return nil, &Error{Keyword: "schema", Msg: fmt.Sprintf("the schema is %d bytes; Loops' limit is %d", len(schema), MaxSchemaBytes)}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, schema); err != nil {
		return nil, &Error{Keyword: "schema", Msg: fmt.Sprintf("the schema is not JSON: %v", err)}
	}
	key := sha256.Sum256(buf.Bytes())
	if c, ok := schemaCache.Get(key); ok {
		return c.a, c.err
	}
	a, err := compileSchema(buf.Bytes())
	schemaCache.Add(key, compiled{a, err})
	return a, err
}

func compileSchema(schema []byte) (*Automaton, error) {
	deadline := time.Now().Add(CompileTimeout)
	n := &nfa{limit: maxNFAStates}
	c := &compiler{n: n, root: schema, refs: map[string]int{}, deadline: deadline}
	f, err := c.value(schema, "#", 0)
	if err == nil {
		err = c.check()
	}
	if errors.Is(err, errTooLarge) {
		return nil, tooLarge()
	}
	if err != nil {
		return nil, err
	}
	a, err := determinize(n, f.start, f.end, deadline)
	if err != nil {
		return nil, tooLarge()
	}
	if a == nil {
		return nil, &Error{Keyword: "schema", Path: "#", Msg: fmt.Sprintf("the schema admits no value Loops can write (a recursive $ref must be able to end within %d expansions)", MaxRefExpansions)}
	}
	return a, nil
}

func tooLarge() error {
	return &Error{Keyword: "schema", Path: "#", Msg: fmt.Sprintf(
		"the schema is too large to enforce: its automaton passes Loops' limits (%d states, %d NFA states, %v to compile); simplify it (fewer anyOf branches, smaller minItems/maxItems, shallower nesting)",
		MaxStates, maxNFAStates, CompileTimeout)}
}
