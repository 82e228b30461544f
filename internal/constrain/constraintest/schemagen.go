// Package constraintest generates random JSON Schemas of the subset package constrain
// enforces, for property tests: every text the automaton of such a schema accepts must
// validate against it.
package constraintest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
)

// Schema returns a random schema of the supported subset (objects with required and
// optional properties, additionalProperties false, strings, numbers, integers, booleans,
// null, enum, const, arrays with items and bounds, anyOf, nullable types, $defs with $ref
// and a bounded recursive one), nested at most depth deep, as JSON.
func Schema(r *rand.Rand, depth int) []byte {
	g := &gen{r: r, defs: map[string]any{}}
	root := g.object(depth, true)
	if r.IntN(3) == 0 {
		// a definition used by reference, possibly recursive through an optional property
		name := fmt.Sprintf("d%d", r.IntN(100))
		def := g.object(max(depth-1, 1), false)
		if r.IntN(2) == 0 {
			props := def["properties"].(map[string]any)
			props["next"] = map[string]any{"anyOf": []any{map[string]any{"$ref": "#/$defs/" + name}, map[string]any{"type": "null"}}}
			def["required"] = append(def["required"].([]string), "next")
		}
		g.defs[name] = def
		root["properties"].(map[string]any)["ref"] = map[string]any{"$ref": "#/$defs/" + name}
		root["required"] = append(root["required"].([]string), "ref")
		root["$defs"] = g.defs
	}
	b, err := json.Marshal(root)
	if err != nil {
		panic(err)
	}
	return b
}

type gen struct {
	r    *rand.Rand
	defs map[string]any
}

func (g *gen) object(depth int, strict bool) map[string]any {
	props := map[string]any{}
	required := []string{}
	for i := range 1 + g.r.IntN(4) {
		name := fmt.Sprintf("p%d_%s", i, []string{"a", "name", "x y", "é", "q\"t"}[g.r.IntN(5)])
		props[name] = g.value(depth - 1)
		if strict || g.r.IntN(3) > 0 {
			required = append(required, name)
		}
	}
	return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
}

func (g *gen) value(depth int) any {
	k := g.r.IntN(12)
	if depth <= 0 {
		k = g.r.IntN(7)
	}
	switch k {
	case 0:
		return map[string]any{"type": "string"}
	case 1:
		return map[string]any{"type": "integer"}
	case 2:
		return map[string]any{"type": "number"}
	case 3:
		return map[string]any{"type": "boolean"}
	case 4:
		return map[string]any{"type": []string{"string", "null"}}
	case 5:
		return map[string]any{"type": "string", "enum": []string{"red", "green", "a\"b", "ü"}[:1+g.r.IntN(4)]}
	case 6:
		return map[string]any{"const": []any{1, "c", true, nil, 2.5}[g.r.IntN(5)]}
	case 7, 8:
		return g.object(depth, g.r.IntN(2) == 0)
	case 9:
		a := map[string]any{"type": "array", "items": g.value(depth - 1)}
		if g.r.IntN(2) == 0 {
			lo := g.r.IntN(3)
			a["minItems"], a["maxItems"] = lo, lo+g.r.IntN(3)
		}
		return a
	case 10:
		return map[string]any{"anyOf": []any{g.value(depth - 1), g.value(depth - 1)}}
	default:
		return map[string]any{"type": "array", "items": map[string]any{"type": "integer"}}
	}
}
