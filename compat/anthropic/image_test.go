package anthropic

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/compat/internal/infer"
)

// pic is a 24×16 grey PNG.
const pic = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAQCAAAAAApT+BJAAAADklEQVR4nGNgGAWDCQAAAZAAAdO7EP4AAAAASUVORK5CYII="

// TestDecodeImageBlocks: a user turn's base64 image blocks are kept in order with its text
// blocks (checked: format, header, size); url sources, other media types, unreadable
// bytes and images outside a user turn are 400s that say what to send.
func TestDecodeImageBlocks(t *testing.T) {
	body := `{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
	  {"type": "text", "text": "What is this?"},
	  {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "` + pic + `"}, "cache_control": {"type": "ephemeral"}},
	  {"type": "text", "text": "Be brief."}]}]}`
	req, err := decodeRequest([]byte(body), false)
	require.NoError(t, err)
	data, _ := base64.StdEncoding.DecodeString(pic)
	im := &infer.Image{Data: data, Format: "png", Width: 24, Height: 16}
	require.Equal(t, []infer.Message{{Role: "user", Content: "What is this?\nBe brief.",
		Parts: []infer.Part{{Text: "What is this?"}, {Image: im}, {Text: "Be brief."}}}}, req.messages)

	for block, want := range map[string]string{
		`{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}`:                   "Loops fetches no URLs",
		`{"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "` + pic + `"}}`:  "image/png or image/jpeg",
		`{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "` + pic + `"}}`: "its bytes are png",
		`{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}`:         "not a readable png",
		`{"type": "image"}`: "source is required",
	} {
		_, err := decodeRequest([]byte(`{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [`+block+`]}]}`), false)
		require.ErrorContains(t, err, want, block)
	}
	_, err = decodeRequest([]byte(`{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "`+pic+`"}}]}]}`), false)
	require.ErrorContains(t, err, "not supported in a assistant turn")
}
