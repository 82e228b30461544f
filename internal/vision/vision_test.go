package vision

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// encode returns a w×h image encoded as format.
func encode(t testing.TB, format string, w, h int) []byte {
	t.Helper()
	im := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			im.Set(x, y, color.RGBA{uint8(x), uint8(y), 7, 255})
		}
	}
	var b bytes.Buffer
	if format == "png" {
		require.NoError(t, png.Encode(&b, im))
	} else {
		require.NoError(t, jpeg.Encode(&b, im, nil))
	}
	return b.Bytes()
}

// pngHeader is a PNG's signature and IHDR chunk claiming w×h pixels, with no pixel data: a
// crafted image whose header alone would make a decoder allocate w·h·4 bytes.
func pngHeader(w, h uint32) []byte {
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 6 // 8-bit RGBA
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	_ = binary.Write(&b, binary.BigEndian, uint32(len(ihdr)))
	chunk := append([]byte("IHDR"), ihdr...)
	b.Write(chunk)
	_ = binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(chunk))
	return b.Bytes()
}

func TestHeader(t *testing.T) {
	for _, f := range Formats {
		w, h, err := Header(encode(t, f, 40, 30), f)
		require.NoError(t, err, f)
		require.Equal(t, [2]int{40, 30}, [2]int{w, h})
	}
	jp := encode(t, "jpeg", 8, 8)
	for _, c := range []struct {
		data   []byte
		format string
		want   string
	}{
		{pngHeader(30000, 30000), "png", "30000×30000 pixels, over the limit of 8192 pixels a side"},
		{pngHeader(8000, 8000), "png", "over the limit of 33554432"},
		{pngHeader(4000, 10), "png", "aspect ratio over 200"},
		{jp, "png", `set format to "jpeg"`},
		{jp[:20], "jpeg", "header cannot be read"},
		{[]byte("GIF89a......"), "png", "header cannot be read"},
		{jp, "gif", `format "gif" is not served`},
		{nil, "png", "no data"},
		{make([]byte, MaxBytes+1), "png", "over the limit of 8388608 (8 MiB)"},
	} {
		_, _, err := Header(c.data, c.format)
		require.ErrorContains(t, err, c.want)
	}
}

// TestTokens: the token counts of transformers 5.24's Qwen2-VL smart_resize
// (image_processing_pil_qwen2_vl.smart_resize; (h/patch)·(w/patch)/merge²), computed there.
func TestTokens(t *testing.T) {
	for _, c := range [][7]int64{
		{16, 2, 65536, 16777216, 1, 1, 64},
		{16, 2, 65536, 16777216, 64, 64, 64},
		{16, 2, 65536, 16777216, 640, 480, 300},
		{16, 2, 65536, 16777216, 1920, 1080, 2040},
		{16, 2, 65536, 16777216, 8192, 8192, 16384},
		{16, 2, 65536, 16777216, 333, 777, 240},
		{16, 2, 65536, 16777216, 5000, 25, 156},
		{16, 2, 65536, 16777216, 56, 56, 64},
		{16, 2, 65536, 16777216, 1000, 7, 96},
		{14, 2, 3136, 1003520, 640, 480, 391},
		{14, 2, 3136, 1003520, 1920, 1080, 1222},
		{14, 2, 3136, 1003520, 60, 60, 4},
		{14, 2, 3136, 1003520, 100, 3, 12},
		{8, 2, 1024, 4096, 32, 32, 4},
		{8, 2, 1024, 4096, 48, 40, 6},
		{8, 2, 1024, 4096, 90, 17, 6},
		{8, 2, 1024, 4096, 200, 200, 16},
	} {
		v := &loopsv1.VisionInfo{PatchSize: int32(c[0]), MergeSize: int32(c[1]), MinPixels: c[2], MaxPixels: c[3]}
		n, err := Tokens(v, int(c[4]), int(c[5]))
		require.NoError(t, err)
		require.Equal(t, int(c[6]), n, "%v", c)
	}
}

func TestCheck(t *testing.T) {
	vl := &loopsv1.ModelInfo{Name: "tiny-vl", Modalities: []string{"text", "image"},
		Vision: &loopsv1.VisionInfo{PatchSize: 8, MergeSize: 2, MinPixels: 1024, MaxPixels: 4096}}
	data := encode(t, "png", 48, 40) // 6 tokens
	im := func(off, n int32) *loopsv1.Image {
		return &loopsv1.Image{Data: data, Format: "png", Offset: off, Tokens: n, Width: 48, Height: 40}
	}
	toks := []int32{5, 0, 0, 0, 0, 0, 0, 9}
	n, err := Check(vl, []*loopsv1.Image{im(1, 6)}, toks, 3)
	require.NoError(t, err)
	require.Equal(t, 4, n)

	text := &loopsv1.ModelInfo{Name: "loops/tiny", Modalities: []string{"text"}}
	_, err = Check(text, []*loopsv1.Image{im(1, 6)}, toks, 0)
	require.ErrorContains(t, err, "model loops/tiny takes [text] input only, not images")

	_, err = Check(vl, []*loopsv1.Image{im(1, 5)}, toks, 0)
	require.ErrorContains(t, err, "has expected_tokens 5, but tiny-vl's image processor makes 6 tokens of it")
	_, err = Check(vl, []*loopsv1.Image{im(3, 6)}, toks, 0)
	require.ErrorContains(t, err, "outside the 8-token input")
	_, err = Check(vl, []*loopsv1.Image{im(0, 6)}, toks, 0)
	require.ErrorContains(t, err, "position 0 holds token 5, not the placeholder 0")
	_, err = Check(vl, []*loopsv1.Image{im(1, 6)}, toks, MaxImages)
	require.ErrorContains(t, err, "more than 16 images")
	bad := im(1, 6)
	bad.Width = 47
	_, err = Check(vl, []*loopsv1.Image{bad}, toks, 0)
	require.ErrorContains(t, err, "says 47×40 pixels but its header says 48×40")
}

// FuzzHeader: no byte string makes the header check panic or accept an image over the
// limits; an accepted image's token count is positive and bounded.
func FuzzHeader(f *testing.F) {
	f.Add(encode(f, "png", 48, 40), "png")
	f.Add(encode(f, "jpeg", 17, 9), "jpeg")
	f.Add(pngHeader(30000, 30000), "png")
	f.Add(pngHeader(4096, 4096), "png")
	f.Add([]byte("\xff\xd8\xff\xc0\x00\x11\x08\x75\x30\x75\x30\x03"), "jpeg")
	v := &loopsv1.VisionInfo{PatchSize: 16, MergeSize: 2, MinPixels: 65536, MaxPixels: 16777216}
	f.Fuzz(func(t *testing.T, data []byte, format string) {
		w, h, err := Header(data, format)
		if err != nil {
			return
		}
		require.True(t, w > 0 && h > 0 && w <= MaxSide && h <= MaxSide && int64(w)*int64(h) <= MaxPixels)
		n, err := Tokens(v, w, h)
		require.NoError(t, err)
		require.True(t, n >= 1 && n <= MaxTokens, "%d×%d: %d tokens", w, h, n)
	})
}
