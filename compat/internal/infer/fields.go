package infer

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The JSON field readers of the adapters' request decoders: each checks one field's type
// and range and answers a BadField naming it.

// DecodeObject decodes a JSON object into its raw fields; param names it in errors ("" for
// the body). Duplicate keys are refused: the first and the last would disagree on intent.
func DecodeObject(b []byte, param string) (map[string]json.RawMessage, error) {
	where := "the request body"
	if param != "" {
		where = param
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, BadField(param, "%s must be a JSON object", where)
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, BadField(param, "malformed JSON in %s: %v", where, err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, BadField(param, "malformed JSON in %s: %v", where, err)
		}
		if _, dup := fields[key]; dup {
			return nil, BadField(Join(param, key), "%s is given twice", Join(param, key))
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, BadField(param, "malformed JSON in %s: %v", where, err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, BadField(param, "malformed JSON in %s: trailing data after the object", where)
	}
	return fields, nil
}

func Join(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func SortedKeys(m map[string]json.RawMessage) []string {
	return slices.Sorted(maps.Keys(m))
}

func IsNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

func Str(raw json.RawMessage, param string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", BadField(param, "%s must be a string", param)
	}
	return s, nil
}

// Integer parses a JSON integer in [lo, hi].
func Integer(raw json.RawMessage, param string, lo, hi int64) (int64, error) {
	s := strings.TrimSpace(string(raw))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// 3.0 is an integer too (some clients send floats).
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, BadField(param, "%s must be an integer, got %s", param, Truncate(s))
		}
		v = int64(f)
	}
	if v < lo || v > hi {
		return 0, BadField(param, "%s = %d is out of range [%d, %d]", param, v, lo, hi)
	}
	return v, nil
}

// Float parses a JSON number in [lo, hi].
func Float(raw json.RawMessage, param string, lo, hi float64) (float64, error) {
	s := strings.TrimSpace(string(raw))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || len(s) == 0 || s[0] == '"' {
		return 0, BadField(param, "%s must be a number, got %s", param, Truncate(s))
	}
	if v < lo || v > hi {
		return 0, BadField(param, "%s = %g is out of range [%g, %g]", param, v, lo, hi)
	}
	return v, nil
}

// Seed accepts any integer in [-2^63, 2^64-1]; negative seeds keep their two's complement
// bits, as on the Tinker routes.
func Seed(raw json.RawMessage) (*uint64, error) {
	s := strings.TrimSpace(string(raw))
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return &u, nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		u := uint64(i)
		return &u, nil
	}
	return nil, BadField("seed", "seed must be an integer that fits in 64 bits, got %s", Truncate(s))
}
