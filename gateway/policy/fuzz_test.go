package policy

import (
	"slices"
	"testing"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
)

// FuzzParse: any policy file is parsed or refused without panicking, and a parsed one's
// allowed_modalities always allow text, allow image exactly when listed (or left out), and
// narrow a model's catalog modalities to those.
func FuzzParse(f *testing.F) {
	for _, s := range []string{example,
		"default: {allowed_modalities: [text]}\nworkspaces:\n  w: {allowed_modalities: [text, image]}\n",
		"default: {allowed_modalities: [image]}\n", "default: {allowed_modalities: []}\n",
		`{"workspaces": {"w": {"allowed_modalities": ["text", "text"], "dedicated": "always"}}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := Parse([]byte(in))
		if err != nil {
			return
		}
		e, err := NewEnforcer(p, []string{"m"})
		if err != nil {
			return
		}
		m := &loopsv1.ModelInfo{Name: "m", Modalities: []string{ModalityText, ModalityImage}}
		for _, ws := range append(p.Workspaces(), "not-listed") {
			require.NoError(t, e.AllowModality(ws, ModalityText, "x"))
			l := e.Limits(ws)
			img := e.AllowModality(ws, ModalityImage, "x")
			if l.AllowedModalities == nil || slices.Contains(l.AllowedModalities, ModalityImage) {
				require.NoError(t, img)
			} else {
				require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(img))
			}
			if got := e.Models(ws, []*loopsv1.ModelInfo{m}); len(got) == 1 {
				require.Equal(t, img == nil, slices.Contains(got[0].GetModalities(), ModalityImage))
			}
		}
	})
}
