package evals

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

var (
	nllSpec = Spec{Kind: loopsv1.EvalKind_EVAL_KIND_NLL}
	mcSpec  = Spec{Kind: loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE}
	genRe   = Spec{Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, Match: loopsv1.EvalMatch_EVAL_MATCH_REGEX}
)

func TestDecodeRows(t *testing.T) {
	rows, err := Decode(nllSpec, []byte("{\"prompt\": \"a\", \"completion\": [1, 2]}\n\n  \n{\"prompt\": [3], \"completion\": \"b\"}"))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, "a", rows[0].Prompt.S)
	require.Equal(t, []int32{1, 2}, rows[0].Completion.Tokens)
	require.True(t, rows[1].Prompt.IsTokens)

	rows, err = Decode(mcSpec, []byte(`{"prompt": "q", "choices": ["x", "y", [7]], "answer": 2}`))
	require.NoError(t, err)
	require.Equal(t, 2, *rows[0].Answer)

	rows, err = Decode(genRe, []byte(`{"prompt": "q", "target": "^a+b$"}`))
	require.NoError(t, err)
	require.True(t, Matches(loopsv1.EvalMatch_EVAL_MATCH_REGEX, &rows[0], "aab"))
	require.False(t, Matches(loopsv1.EvalMatch_EVAL_MATCH_REGEX, &rows[0], "ba"))
}

func TestDecodeNamesTheLine(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		data string
		line int
		msg  string
	}{
		{nllSpec, "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}", 2, `"completion" is missing`},
		{nllSpec, "\n\nnot json", 3, "not a valid row object"},
		{nllSpec, `{"prompt": "a", "completion": "b", "extra": 1}`, 1, `unknown field "extra"`},
		{nllSpec, `{"prompt": "a", "completion": [-1]}`, 1, "out of range"},
		{nllSpec, `{"prompt": "a", "completion": "b"} {"prompt": "c"}`, 1, "more than one JSON value"},
		{mcSpec, `{"prompt": "q", "choices": ["x", "y"], "answer": 2}`, 1, `"answer" must be the index`},
		{mcSpec, `{"prompt": "q", "choices": ["x"], "answer": 0}`, 1, `2 to 16`},
		{genRe, `{"prompt": "q", "target": "a(("}`, 1, "does not compile"},
		{genRe, `{"prompt": "q", "target": [1]}`, 1, "not a string"},
	} {
		_, err := Decode(tc.spec, []byte(tc.data))
		var le *LineError
		require.ErrorAs(t, err, &le, tc.data)
		require.Equal(t, tc.line, le.Line, tc.data)
		require.Contains(t, le.Error(), tc.msg)
	}
}

func TestDecodeBounds(t *testing.T) {
	_, err := Decode(nllSpec, []byte(strings.Repeat("x", MaxDatasetBytes+1)))
	require.ErrorContains(t, err, "more than 4194304")
	_, err = Decode(nllSpec, []byte(strings.Repeat(`{"prompt":"a","completion":"b"}`+"\n", MaxRows+1)))
	var le *LineError
	require.ErrorAs(t, err, &le)
	require.Equal(t, MaxRows+1, le.Line)
	_, err = Decode(nllSpec, []byte(`{"prompt": "`+strings.Repeat("a", MaxTextBytes+1)+`", "completion": "b"}`))
	require.ErrorContains(t, err, "more than 32768")
	_, err = Decode(nllSpec, []byte("\n \n"))
	require.ErrorContains(t, err, "no rows")
	require.False(t, errors.As(err, &le))
	_, err = Decode(nllSpec, []byte{0xff, '\n'})
	require.ErrorContains(t, err, "UTF-8")
}

// FuzzDecode: any input either decodes into rows that satisfy the kind's rules or is
// refused with an error; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(int8(1), int8(0), []byte(`{"prompt": "a", "completion": [1, 2]}`))
	f.Add(int8(2), int8(0), []byte("{\"prompt\": [1], \"choices\": [\"x\", [2]], \"answer\": 1}\n"))
	f.Add(int8(3), int8(3), []byte(`{"prompt": "q", "target": "a+"}`))
	f.Add(int8(3), int8(1), []byte("{\"prompt\": \"q\", \"target\": \"a\"}\n\n{\"prompt\": 1}"))
	f.Add(int8(4), int8(0), []byte(`{"prompt": "q", "info": {"answer": [1, "x"]}}`))
	f.Fuzz(func(t *testing.T, kind, match int8, data []byte) {
		spec := Spec{Kind: loopsv1.EvalKind(kind), Match: loopsv1.EvalMatch(match)}
		rows, err := Decode(spec, data)
		if err != nil {
			return
		}
		require.NotEmpty(t, rows)
		require.LessOrEqual(t, len(rows), MaxRows)
		for _, r := range rows {
			require.False(t, r.Prompt.Empty())
			switch spec.Kind {
			case loopsv1.EvalKind_EVAL_KIND_NLL:
				require.False(t, r.Completion.Empty())
			case loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE:
				require.GreaterOrEqual(t, *r.Answer, 0)
				require.Less(t, *r.Answer, len(r.Choices))
			case loopsv1.EvalKind_EVAL_KIND_GENERATION:
				require.NotEmpty(t, r.Target.S)
				_ = Matches(spec.Match, &r, "text")
			case loopsv1.EvalKind_EVAL_KIND_REWARD:
				require.LessOrEqual(t, len(r.Info), MaxInfoBytes)
			default:
				t.Fatalf("kind %v decoded", spec.Kind)
			}
		}
	})
}
