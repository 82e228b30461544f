package infer

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/png"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// pngOf encodes a w×h PNG.
func pngOf(t testing.TB, w, h int) []byte {
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))))
	return b.Bytes()
}

// vlTemplate renders image parts as Qwen-VL's templates do, with <|endoftext|> (a single
// added token of loops/tiny's tokenizer) standing for <|image_pad|>.
const vlTemplate = `{% for m in messages %}<|im_start|>{{ m['role'] }}
{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|im_start|><|endoftext|><|im_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// vlText is loops/tiny's tokenizer with vlTemplate, and a catalog entry that takes images
// (patch 4, merge 2: a 24×16 image is 6 tokens) with <|endoftext|> as the image token.
func vlText(t *testing.T) (*Text, *loopsv1.ModelInfo) {
	tx := tinyText(t)
	tmpl, err := compileTemplate(vlTemplate)
	require.NoError(t, err)
	tx.tmpl = tmpl
	pad := tx.Encode(tiny.EOS)
	require.Len(t, pad, 1)
	return tx, &loopsv1.ModelInfo{Name: "vl", Modalities: []string{"text", "image"},
		Vision: &loopsv1.VisionInfo{PatchSize: 4, MergeSize: 2, MinPixels: 64, MaxPixels: 4096, ImageTokenId: pad[0]}}
}

// TestImagesExpandInTheTemplate: each image part's placeholder, where the chat template
// put it, becomes the image's tokens (placeholders 0, as many as the processor makes),
// with the image at their offset; the rest is the template's text tokenized as is.
func TestImagesExpandInTheTemplate(t *testing.T) {
	tx, info := vlText(t)
	a, b := pngOf(t, 24, 16), pngOf(t, 16, 16)
	msgs := []Message{{Role: "user", Content: "look\nand", Parts: []Part{
		{Text: "look"}, {Image: &Image{Data: a, Format: "png", Width: 24, Height: 16}}, {Text: "and"},
		{Image: &Image{Data: b, Format: "png", Width: 16, Height: 16}}}}}
	ps, imgs, err := prompts(tx, info, &Request{Messages: msgs})
	require.NoError(t, err)
	pre := tx.Encode("<|im_start|>user\nlook<|im_start|>")
	mid := tx.Encode("<|im_end|>and<|im_start|>")
	post := tx.Encode("<|im_end|><|im_end|>\n<|im_start|>assistant\n")
	want := append(append(append(append(append([]int32{}, pre...), make([]int32, 6)...), mid...), make([]int32, 4)...), post...)
	require.Equal(t, want, ps[0])
	require.Empty(t, cmpImages(imgs, []*loopsv1.Image{
		{Data: a, Format: "png", Offset: int32(len(pre)), Tokens: 6, Width: 24, Height: 16},
		{Data: b, Format: "png", Offset: int32(len(pre) + 6 + len(mid)), Tokens: 4, Width: 16, Height: 16}}))

	// The limit counts the images' tokens: 6 + 4 image tokens and the text's fit in
	// len(want), not in one less.
	info.MaxSequenceLength = int32(len(want))
	_, _, err = prompts(tx, info, &Request{Messages: msgs})
	require.NoError(t, err)
	info.MaxSequenceLength--
	_, _, err = prompts(tx, info, &Request{Messages: msgs})
	requireTooLong(t, err, "messages")
	info.MaxSequenceLength = 0

	// Text that holds the placeholder itself does not pass for an image.
	bad := []Message{{Role: "user", Content: "x", Parts: []Part{{Text: tiny.EOS}, {Image: msgs[0].Parts[1].Image}}}}
	_, _, err = prompts(tx, info, &Request{Messages: bad})
	requireBad(t, err, "messages", "2 image placeholders")

	// A model that takes no images names its modalities.
	_, _, err = prompts(tx, &loopsv1.ModelInfo{Name: tiny.Name, Modalities: []string{"text"}}, &Request{Messages: msgs})
	requireBad(t, err, "messages", "model loops/tiny takes [text] input only, not images")
	// One whose catalog gives no image token cannot place them.
	noTok := &loopsv1.ModelInfo{Name: "vl", Modalities: info.Modalities, Vision: &loopsv1.VisionInfo{PatchSize: 4, MergeSize: 2, MaxPixels: 4096}}
	_, _, err = prompts(tx, noTok, &Request{Messages: msgs})
	requireBad(t, err, "model", "no image token id")
	// More than vision.MaxImages.
	many := Message{Role: "user"}
	for range 17 {
		many.Parts = append(many.Parts, msgs[0].Parts[1])
	}
	_, _, err = prompts(tx, info, &Request{Messages: []Message{many}})
	requireBad(t, err, "messages", "over the limit of 16")
}

// imageSampling records the sample requests it is asked for.
type imageSampling struct {
	fakeSampling
	reqs []*loopsv1.SampleRequest
}

func (f *imageSampling) SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	f.reqs = append(f.reqs, req)
	return f.fakeSampling.SampleStream(ctx, req, sink)
}

type vlModels struct {
	fakeModels
	info *loopsv1.ModelInfo
}

func (m vlModels) ListModels(context.Context, *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	return &loopsv1.ListModelsResponse{Models: []*loopsv1.ModelInfo{m.info}}, nil
}

// TestImagesReachTheCore: the engine samples the expanded prompt with its images, as a
// Tinker sample with image chunks would be asked.
func TestImagesReachTheCore(t *testing.T) {
	tx, info := vlText(t)
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	info.Name, info.TokenizerId = tiny.Name, dir
	f := &imageSampling{fakeSampling: fakeSampling{seqs: []*loopsv1.SampledSequence{{Tokens: []int32{5}, Logprobs: []float32{-1}}}}}
	e := New(Services{Sampling: f, Models: vlModels{info: info}}, Options{})
	e.models.byName[tiny.Name] = tx // the test's template
	pic := &Image{Data: pngOf(t, 24, 16), Format: "png", Width: 24, Height: 16}
	msgs := []Message{{Role: "user", Parts: []Part{{Image: pic}}}}
	_, err := e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: msgs, N: 1, Params: &loopsv1.SamplingParams{}})
	require.NoError(t, err)
	want, imgs, err := prompts(tx, info, &Request{Messages: msgs})
	require.NoError(t, err)
	require.Len(t, f.reqs, 1)
	require.Equal(t, want[0], f.reqs[0].GetPrompt())
	require.Empty(t, cmpImages(f.reqs[0].GetPromptImages(), imgs))
	require.Len(t, imgs, 1)
}

// TestDecodeImage: data URLs and base64 images are checked before use; every refusal says
// what to send.
func TestDecodeImage(t *testing.T) {
	p := pngOf(t, 24, 16)
	enc := base64.StdEncoding.EncodeToString(p)
	im, err := DecodeImageURL("data:image/png;base64,"+enc, "u")
	require.NoError(t, err)
	require.Equal(t, &Image{Data: p, Format: "png", Width: 24, Height: 16}, im)
	for url, want := range map[string]string{
		"https://example.com/cat.png":                                "Loops fetches no URLs",
		"http://x/y.png":                                             "Loops fetches no URLs",
		"data:image/png," + enc:                                      "data:<media type>;base64",
		"data:image/gif;base64," + enc:                               `media type "image/gif" is not served`,
		"data:image/jpeg;base64," + enc:                              `set format to "png"`,
		"data:image/png;base64,!!":                                   "not valid base64",
		"data:image/png;base64,AAAA":                                 "not a readable png",
		"data:image/png;base64," + strings.Repeat("A", maxEncoded+4): "more than an image of the limit",
	} {
		_, err := DecodeImageURL(url, "u")
		requireBad(t, err, "u", want)
	}
}

func requireBad(t *testing.T, err error, param, contains string) {
	t.Helper()
	var ae *Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 400, ae.Status)
	require.Equal(t, param, ae.Param)
	require.Contains(t, ae.Message, contains)
}

func cmpImages(got, want []*loopsv1.Image) string {
	return cmp.Diff(want, got, protocmp.Transform())
}

// FuzzImageURL: any URL either decodes to an image whose header passed (vision.Header) or is
// a 400 naming the part; it never panics.
func FuzzImageURL(f *testing.F) {
	p := pngOf(f, 24, 16)
	f.Add("data:image/png;base64," + base64.StdEncoding.EncodeToString(p))
	f.Add("data:image/jpeg;base64,/9j/4AAQ")
	f.Add("data:image/png;base64," + base64.StdEncoding.EncodeToString(p[:30]))
	f.Add("https://example.com/a.png")
	f.Add("data:;base64,")
	f.Fuzz(func(t *testing.T, url string) {
		im, err := DecodeImageURL(url, "u")
		if err != nil {
			var ae *Error
			require.ErrorAs(t, err, &ae)
			require.Equal(t, 400, ae.Status)
			return
		}
		require.True(t, im.Width > 0 && im.Height > 0 && len(im.Data) > 0)
		require.Contains(t, []string{"png", "jpeg"}, im.Format)
	})
}

// TestQwenVLTemplate: Qwen2-VL's chat template (its Hugging Face chat_template, with
// namespace counters and `'image' in content` tests) renders image parts as the image
// placeholder, between the text parts, as jinja2 does.
func TestQwenVLTemplate(t *testing.T) {
	src, err := os.ReadFile("testdata/qwen2_vl.jinja")
	require.NoError(t, err)
	tx := tinyText(t)
	tx.tmpl, err = compileTemplate(string(src))
	require.NoError(t, err)
	pic := &Image{Data: pngOf(t, 24, 16), Format: "png", Width: 24, Height: 16}
	out, err := tx.Render([]Message{{Role: "user", Parts: []Part{{Text: "What is"}, {Image: pic}, {Text: "this?"}}}, {Role: "assistant", Content: "A cat."}}, nil)
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is<|vision_start|><|image_pad|><|vision_end|>this?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n<|im_start|>assistant\n", out)
}
