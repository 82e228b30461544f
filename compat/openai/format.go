package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"github.com/loops-dev/loops/compat/internal/infer"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/constrain"
	"github.com/loops-dev/loops/internal/semantics"
)

// schemaName is OpenAI's rule for json_schema.name.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// decodeResponseFormat reads response_format: {"type": "text"}, {"type": "json_object"}
// or {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}.
// A schema is compiled here (constrain.Schema, cached), so one Loops cannot enforce is a
// 400 naming the keyword before any work. nil means free text.
func decodeResponseFormat(raw json.RawMessage) (*loopsv1.ResponseFormat, error) {
	const name = "response_format"
	fields, err := infer.DecodeObject(raw, name)
	if err != nil {
		return nil, err
	}
	typ := ""
	if v, ok := fields["type"]; ok && !infer.IsNull(v) {
		if typ, err = infer.Str(v, name+".type"); err != nil {
			return nil, err
		}
	}
	for _, k := range infer.SortedKeys(fields) {
		if k != "type" && k != "json_schema" && !infer.IsNull(fields[k]) {
			return nil, unsupported(name+"."+k, "response_format has type and, for json_schema, json_schema")
		}
	}
	js, hasSchema := fields["json_schema"]
	hasSchema = hasSchema && !infer.IsNull(js)
	if hasSchema && typ != "json_schema" {
		return nil, badField(name+".json_schema", "response_format.json_schema goes with type \"json_schema\"")
	}
	switch typ {
	case "text":
		return nil, nil
	case "json_object":
		return &loopsv1.ResponseFormat{Type: loopsv1.ResponseFormat_TYPE_JSON_OBJECT}, nil
	case "json_schema":
		if !hasSchema {
			return nil, badField(name+".json_schema", "response_format type json_schema needs json_schema: {\"name\", \"schema\", \"strict\"}")
		}
		schema, err := decodeJSONSchema(js)
		if err != nil {
			return nil, err
		}
		return &loopsv1.ResponseFormat{Type: loopsv1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: string(schema)}, nil
	case "":
		return nil, badField(name+".type", "response_format.type is required: text, json_object or json_schema")
	}
	return nil, unsupported(name+".type", fmt.Sprintf("response_format type %q is not supported; use text, json_object or json_schema", truncate(typ)))
}

// decodeJSONSchema reads response_format.json_schema and returns its schema, compiled once
// to check that Loops can enforce it.
func decodeJSONSchema(raw json.RawMessage) (json.RawMessage, error) {
	const param = "response_format.json_schema"
	fields, err := infer.DecodeObject(raw, param)
	if err != nil {
		return nil, err
	}
	var schema json.RawMessage
	hasName := false
	for _, k := range infer.SortedKeys(fields) {
		v := fields[k]
		if infer.IsNull(v) {
			continue
		}
		switch k {
		case "name":
			s, err := infer.Str(v, param+".name")
			if err != nil {
				return nil, err
			}
			if !schemaName.MatchString(s) {
				return nil, badField(param+".name", "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -")
			}
			hasName = true
		case "description":
			if _, err := infer.Str(v, param+".description"); err != nil {
				return nil, err
			}
		case "strict":
			// Loops always enforces the schema, strict or not.
			var b bool
			if json.Unmarshal(v, &b) != nil {
				return nil, badField(param+".strict", "response_format.json_schema.strict must be a boolean")
			}
		case "schema":
			schema = v
		default:
			return nil, unsupported(param+"."+k, "json_schema has name, description, schema and strict")
		}
	}
	switch {
	case !hasName:
		return nil, badField(param+".name", "response_format.json_schema.name is required")
	case schema == nil:
		return nil, badField(param+".schema", "response_format.json_schema.schema is required: the JSON Schema the output must validate against")
	}
	if _, err := constrain.Schema(schema); err != nil {
		var se *constrain.Error
		if errors.As(err, &se) && se.Keyword != "schema" {
			return nil, &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: param + ".schema", code: "unsupported_parameter",
				message: fmt.Sprintf("response_format.json_schema.schema: %v", err)}
		}
		return nil, badField(param+".schema", "%v", err)
	}
	return schema, nil
}

// decodeLogitBias reads logit_bias: {"<token id>": bias}, biases in [-100, 100].
func decodeLogitBias(raw json.RawMessage) (map[int32]float32, error) {
	const name = "logit_bias"
	fields, err := infer.DecodeObject(raw, name)
	if err != nil {
		return nil, err
	}
	if len(fields) > semantics.MaxLogitBiasEntries {
		return nil, badField(name, "logit_bias has %d entries; at most %d are allowed", len(fields), semantics.MaxLogitBiasEntries)
	}
	out := make(map[int32]float32, len(fields))
	for _, k := range infer.SortedKeys(fields) {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 {
			return nil, badField(name, "logit_bias keys must be token ids (non-negative integers as strings), got %q", truncate(k))
		}
		v, err := infer.Float(fields[k], name+"."+k, -semantics.MaxLogitBias, semantics.MaxLogitBias)
		if err != nil {
			return nil, err
		}
		out[int32(id)] = float32(v)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
