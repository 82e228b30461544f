package openai

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/compat/internal/infer"
	"github.com/loops-dev/loops/internal/semantics"
)

// pic is a 24×16 grey PNG.
const pic = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="

// TestDecodeImageParts: a user message's image_url parts with a data URL are kept in order
// with its text parts (checked: format, header, size); an http(s) URL, another detail, a
// format the bytes are not and an image outside a user message are 400s that say what to
// send.
func TestDecodeImageParts(t *testing.T) {
	part := func(url string) string {
		return `{"type": "image_url", "image_url": {"url": "` + url + `"}}`
	}
	body := `{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, ` + part("data:image/png;base64,"+pic) + `]}]}`
	req, err := decodeRequest([]byte(body), true, semantics.MaxNumSamples)
	require.NoError(t, err)
	data, _ := base64.StdEncoding.DecodeString(pic)
	require.Equal(t, []message{{Role: "user", Content: "What is this?",
		Parts: []infer.Part{{Text: "What is this?"}, {Image: &infer.Image{Data: data, Format: "png", Width: 24, Height: 16}}}}}, req.messages)

	for p, want := range map[string]string{
		part("https://example.com/cat.png"):   "Loops fetches no URLs",
		part("data:image/jpeg;base64," + pic): "its bytes are png",
		part("data:image/webp;base64," + pic): "image/png or image/jpeg",
		`{"type": "image_url", "image_url": {"url": "data:image/png;base64,` + pic + `", "detail": "low"}}`: `only "auto"`,
		`{"type": "image_url"}`:                      "image_url: {url}",
		`{"type": "input_audio", "input_audio": {}}`: `only "text" and "image_url"`,
	} {
		_, err := decodeRequest([]byte(`{"model": "m", "messages": [{"role": "user", "content": [`+p+`]}]}`), true, semantics.MaxNumSamples)
		require.ErrorContains(t, err, want, p)
	}
	_, err = decodeRequest([]byte(`{"model": "m", "messages": [{"role": "system", "content": [`+part("data:image/png;base64,"+pic)+`]}, {"role": "user", "content": "q"}]}`), true, semantics.MaxNumSamples)
	require.ErrorContains(t, err, "image_url parts belong to user messages")
}
