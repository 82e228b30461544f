package protocol

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKnownFailing(t *testing.T) {
	k, err := ParseKnownFailing("# comment\n\nbad_input/*/tinker # compat differs\nsdk/get_info # hosted\n")
	require.NoError(t, err)
	reason, ok := k.Match("bad_input/unknown_loss/tinker")
	require.True(t, ok)
	require.Equal(t, "compat differs", reason)
	_, ok = k.Match("bad_input/unknown_loss/grpc")
	require.False(t, ok)
	_, ok = (*KnownFailing)(nil).Match("x")
	require.False(t, ok)
	_, err = ParseKnownFailing("bad_input/x/rest\n")
	require.ErrorContains(t, err, "no reason")
}

func TestReferencesAndPaths(t *testing.T) {
	sc := newScope(map[string]string{"key": "tml-a"})
	doc, err := decodeDoc([]byte(`{"training_run":{"id":"run-1"},"runs":[{"id":"a"},{"id":"b"}]}`))
	require.NoError(t, err)
	require.NoError(t, sc.record("run", doc, map[string]string{"id": "training_run.id"}))
	got, err := sc.expand("${key} ${run.id} ${run.runs.1.id} ${i32le:1,2}")
	require.NoError(t, err)
	require.Equal(t, "tml-a run-1 b AQAAAAIAAAA=", got)
	_, err = sc.expand("${nope.id}")
	require.ErrorContains(t, err, "no earlier step")
	v, ok := lookup(doc, "runs.#")
	require.True(t, ok)
	require.Equal(t, "2", valueText(v))
	v, ok = lookup(doc, "runs.#.id")
	require.True(t, ok)
	require.True(t, containsValue(v, "b"))
	require.False(t, containsValue(v, "c"))
}

func TestEveryCaseRunsSomewhere(t *testing.T) {
	cases, err := EmbeddedCases()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(cases), 40)
	for _, c := range cases {
		require.NotEmpty(t, surfacesOf(c), c.FullName())
	}
}

func TestBadCaseFileIsRejected(t *testing.T) {
	_, err := ParseCaseFile([]byte("cases:\n  - name: x\n    stepz: []\n"))
	require.ErrorContains(t, err, "stepz")
}
