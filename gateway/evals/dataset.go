package evals

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Bounds of a dataset and of its rows.
const (
	// MaxDatasetBytes bounds an uploaded dataset.
	MaxDatasetBytes = 4 << 20
	// MaxRows bounds the rows of a dataset.
	MaxRows = 2000
	// MaxTextBytes bounds one text field (prompt, completion, a choice, a target).
	MaxTextBytes = 32 << 10
	// MaxFieldTokens bounds one field given as token ids.
	MaxFieldTokens = 8192
	// MaxChoices bounds the choices of a multiple-choice row (at least 2).
	MaxChoices = 16
	// MaxPatternBytes bounds a regex target.
	MaxPatternBytes = 1024
	// MaxGenerateTokens bounds Eval.max_tokens; DefaultGenerateTokens is what 0 means.
	MaxGenerateTokens     = 256
	DefaultGenerateTokens = 64
	// MaxInfoBytes bounds a reward row's info; MaxRewardScriptBytes a reward function.
	MaxInfoBytes         = 32 << 10
	MaxRewardScriptBytes = 64 << 10
	// MaxStops and MaxStopBytes bound a generation eval's stop strings.
	MaxStops     = 4
	MaxStopBytes = 64
)

// Text is a field of a row: a string (tokenized with the run's base model's tokenizer) or
// a JSON array of token ids.
type Text struct {
	S      string
	Tokens []int32
	// IsTokens says the field was token ids.
	IsTokens bool
}

// UnmarshalJSON reads a string or an array of token ids.
func (t *Text) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var ids []int64
		if err := json.Unmarshal(b, &ids); err != nil {
			return errors.New("must be a string or an array of token ids (integers)")
		}
		if len(ids) > MaxFieldTokens {
			return fmt.Errorf("has %d token ids, more than %d", len(ids), MaxFieldTokens)
		}
		t.IsTokens, t.Tokens = true, make([]int32, len(ids))
		for i, id := range ids {
			if id < 0 || id > 1<<31-1 {
				return fmt.Errorf("token id %d is out of range (0 to 2^31-1)", id)
			}
			t.Tokens[i] = int32(id)
		}
		return nil
	}
	if err := json.Unmarshal(b, &t.S); err != nil {
		return errors.New("must be a string or an array of token ids (integers)")
	}
	if len(t.S) > MaxTextBytes {
		return fmt.Errorf("is %d bytes, more than %d", len(t.S), MaxTextBytes)
	}
	return nil
}

// Empty reports whether the field holds nothing.
func (t Text) Empty() bool { return len(t.S) == 0 && len(t.Tokens) == 0 }

// Row is one decoded row of a dataset; which fields are set depends on the eval's kind.
type Row struct {
	Prompt     Text   `json:"prompt"`
	Completion *Text  `json:"completion,omitempty"`
	Choices    []Text `json:"choices,omitempty"`
	Answer     *int   `json:"answer,omitempty"`
	Target     *Text  `json:"target,omitempty"`
	// Info is a reward row's extra data, handed to the reward function as parsed JSON.
	Info json.RawMessage `json:"info,omitempty"`

	// re is a regex target, compiled.
	re *regexp.Regexp
}

// LineError is a dataset row that was refused: Line counts from 1.
type LineError struct {
	Line int
	Msg  string
}

func (e *LineError) Error() string { return fmt.Sprintf("dataset line %d: %s", e.Line, e.Msg) }

// Spec is what decoding a dataset needs from its eval.
type Spec struct {
	Kind  loopsv1.EvalKind
	Match loopsv1.EvalMatch
}

// Decode reads a JSONL dataset for an eval of spec: one JSON object per line (blank lines
// skipped, a final line without a newline accepted), at most MaxDatasetBytes and MaxRows
// rows, each checked for its kind: NLL rows {"prompt", "completion"}; multiple-choice rows
// {"prompt", "choices" (2 to 16), "answer" (an index into choices)}; generation rows
// {"prompt", "target"} (a regex target must compile as RE2, at most MaxPatternBytes). A
// field other than these is refused. Reward rows are {"prompt", "info"?} (info any JSON,
// at most MaxInfoBytes). An error other than a *LineError is about the whole
// dataset.
func Decode(spec Spec, data []byte) ([]Row, error) {
	if len(data) > MaxDatasetBytes {
		return nil, fmt.Errorf("the dataset is %d bytes, more than %d: split it into several evals", len(data), MaxDatasetBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("the dataset is not valid UTF-8")
	}
	var rows []Row
	line := 0
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		if len(rows) == MaxRows {
			return nil, &LineError{Line: line, Msg: fmt.Sprintf("the dataset has more than %d rows: split it into several evals", MaxRows)}
		}
		r, err := decodeRow(spec, l)
		if err != nil {
			return nil, &LineError{Line: line, Msg: err.Error()}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, errors.New("the dataset has no rows: upload JSON Lines, one object per row (docs/evals.md)")
	}
	return rows, nil
}

func decodeRow(spec Spec, l []byte) (Row, error) {
	var r Row
	dec := json.NewDecoder(bytes.NewReader(l))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Row{}, fmt.Errorf("not a valid row object: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return Row{}, errors.New("more than one JSON value on the line: one object per line")
	}
	if r.Prompt.Empty() {
		return Row{}, errors.New(`"prompt" is missing or empty`)
	}
	if r.Info != nil && spec.Kind != loopsv1.EvalKind_EVAL_KIND_REWARD {
		return Row{}, errors.New(`"info" belongs to reward rows only`)
	}
	switch spec.Kind {
	case loopsv1.EvalKind_EVAL_KIND_REWARD:
		if r.Completion != nil || r.Choices != nil || r.Answer != nil || r.Target != nil {
			return Row{}, errors.New(`a reward row has only "prompt" and "info"`)
		}
		if len(r.Info) > MaxInfoBytes {
			return Row{}, fmt.Errorf(`"info" is %d bytes, more than %d`, len(r.Info), MaxInfoBytes)
		}
	case loopsv1.EvalKind_EVAL_KIND_NLL:
		if r.Completion == nil || r.Completion.Empty() {
			return Row{}, errors.New(`"completion" is missing or empty: an NLL row is {"prompt", "completion"}`)
		}
		if r.Choices != nil || r.Answer != nil || r.Target != nil {
			return Row{}, errors.New(`an NLL row has only "prompt" and "completion"`)
		}
	case loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE:
		if len(r.Choices) < 2 || len(r.Choices) > MaxChoices {
			return Row{}, fmt.Errorf(`"choices" must hold 2 to %d continuations, got %d`, MaxChoices, len(r.Choices))
		}
		for i, c := range r.Choices {
			if c.Empty() {
				return Row{}, fmt.Errorf(`choice %d is empty`, i)
			}
		}
		if r.Answer == nil || *r.Answer < 0 || *r.Answer >= len(r.Choices) {
			return Row{}, fmt.Errorf(`"answer" must be the index of the right choice (0 to %d)`, len(r.Choices)-1)
		}
		if r.Completion != nil || r.Target != nil {
			return Row{}, errors.New(`a multiple-choice row has only "prompt", "choices" and "answer"`)
		}
	case loopsv1.EvalKind_EVAL_KIND_GENERATION:
		if r.Target == nil || r.Target.Empty() || r.Target.IsTokens {
			return Row{}, errors.New(`"target" is missing, empty or not a string: a generation row is {"prompt", "target"}`)
		}
		if r.Completion != nil || r.Choices != nil || r.Answer != nil {
			return Row{}, errors.New(`a generation row has only "prompt" and "target"`)
		}
		if spec.Match == loopsv1.EvalMatch_EVAL_MATCH_REGEX {
			if len(r.Target.S) > MaxPatternBytes {
				return Row{}, fmt.Errorf(`the regex "target" is %d bytes, more than %d`, len(r.Target.S), MaxPatternBytes)
			}
			re, err := regexp.Compile(r.Target.S)
			if err != nil {
				return Row{}, fmt.Errorf(`the regex "target" does not compile (Go RE2 syntax): %v`, err)
			}
			r.re = re
		}
	default:
		return Row{}, fmt.Errorf("eval kind %v is not one this server scores", spec.Kind)
	}
	return r, nil
}
