package vision

import (
	"bytes"
	"fmt"
	"image"
	_ "image/jpeg" // registers the JPEG header reader used by image.DecodeConfig
	_ "image/png"  // registers the PNG header reader used by image.DecodeConfig
	"math"
	"slices"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Limits of the images of one request; every image is checked against them before its
// pixels are touched.
const (
	// MaxBytes caps one encoded image.
	MaxBytes = 8 << 20
	// MaxImages caps the images of one request (all its datums, or one prompt).
	MaxImages = 16
	// MaxSide caps an image's width and height in pixels.
	MaxSide = 8192
	// MaxPixels caps an image's width·height (what its decoded RGB buffer is sized by).
	MaxPixels = 32 << 20
	// MaxTokens caps the tokens of one image (expected_tokens): MaxPixels at the smallest
	// patch·merge the Qwen-VL models use (16·2) is 32768.
	MaxTokens = 32768
	// MaxAspect is the image processor's own limit on max(w, h) / min(w, h).
	MaxAspect = 200
)

// Formats are the encodings an image chunk may have (Tinker's ImageChunk.format).
var Formats = []string{"png", "jpeg"}

// Modality is the ModelInfo.modalities entry of a model that takes images.
const Modality = "image"

// Header checks an encoded image: its size, that its bytes are the format it claims, and
// its pixel size, read from its header only. It returns the width and height.
func Header(data []byte, format string) (int, int, error) {
	if !slices.Contains(Formats, format) {
		return 0, 0, fmt.Errorf("format %q is not served: send %q or %q", format, "png", "jpeg")
	}
	if len(data) == 0 {
		return 0, 0, fmt.Errorf("the image has no data")
	}
	if len(data) > MaxBytes {
		return 0, 0, fmt.Errorf("the image is %d bytes, over the limit of %d (8 MiB): send a smaller or more compressed image", len(data), MaxBytes)
	}
	cfg, got, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return 0, 0, fmt.Errorf("the image is not a readable %s: its header cannot be read (%v); send a complete PNG or JPEG file", format, err)
	}
	if got != format {
		return 0, 0, fmt.Errorf("the image says format %q but its bytes are %s: set format to %q", format, got, got)
	}
	w, h := cfg.Width, cfg.Height
	switch {
	case w <= 0 || h <= 0:
		return 0, 0, fmt.Errorf("the image is %d×%d pixels: both sides must be positive", w, h)
	case w > MaxSide || h > MaxSide:
		return 0, 0, fmt.Errorf("the image is %d×%d pixels, over the limit of %d pixels a side: downscale it", w, h, MaxSide)
	case int64(w)*int64(h) > MaxPixels:
		return 0, 0, fmt.Errorf("the image is %d×%d = %d pixels, over the limit of %d: downscale it", w, h, int64(w)*int64(h), MaxPixels)
	case max(w, h) > MaxAspect*min(w, h):
		return 0, 0, fmt.Errorf("the image is %d×%d pixels, an aspect ratio over %d: crop or pad it", w, h, MaxAspect)
	}
	return w, h, nil
}

// Tokens is how many tokens the model's image processor makes of a w×h image: it is
// resized as transformers' Qwen2-VL smart_resize does (both sides multiples of
// patch·merge, pixels within [min, max], the aspect ratio kept), then every merge×merge
// block of patches is one token.
func Tokens(v *loopsv1.VisionInfo, w, h int) (int, error) {
	p, m := int64(v.GetPatchSize()), int64(v.GetMergeSize())
	if p <= 0 || m <= 0 || v.GetMinPixels() < 0 || v.GetMaxPixels() <= 0 {
		return 0, fmt.Errorf("the model's vision settings are incomplete (patch_size %d, merge_size %d, max_pixels %d)", p, m, v.GetMaxPixels())
	}
	hb, wb := smartResize(int64(h), int64(w), p*m, v.GetMinPixels(), v.GetMaxPixels())
	return int((hb / p) * (wb / p) / (m * m)), nil
}

// smartResize is transformers' qwen2_vl smart_resize (Python's round is half-to-even).
func smartResize(h, w, factor, minPixels, maxPixels int64) (int64, int64) {
	f := float64(factor)
	hb := int64(math.RoundToEven(float64(h)/f)) * factor
	wb := int64(math.RoundToEven(float64(w)/f)) * factor
	switch {
	case hb*wb > maxPixels:
		beta := math.Sqrt(float64(h*w) / float64(maxPixels))
		hb = max(factor, int64(math.Floor(float64(h)/beta/f))*factor)
		wb = max(factor, int64(math.Floor(float64(w)/beta/f))*factor)
	case hb*wb < minPixels:
		beta := math.Sqrt(float64(minPixels) / float64(h*w))
		hb = int64(math.Ceil(float64(h)*beta/f)) * factor
		wb = int64(math.Ceil(float64(w)*beta/f)) * factor
	}
	return hb, wb
}

// Accepts refuses images for a model whose catalog entry does not say it takes them: the
// error names the model and its modalities, and says what to send instead (instead).
func Accepts(model *loopsv1.ModelInfo, instead string) error {
	if slices.Contains(model.GetModalities(), Modality) && model.GetVision() != nil {
		return nil
	}
	mods := model.GetModalities()
	if len(mods) == 0 { // a backend that does not say serves text
		mods = []string{"text"}
	}
	return fmt.Errorf("model %s takes %v input only, not images: %s, or use a vision-language model whose modalities include image (loops models lists them)", model.GetName(), mods, instead)
}

// Check checks the images of a model input of n tokens against the model: the model must
// take images, every image must pass Header, its tokens must be what the model's processor
// makes of it, they must lie in the input in order without overlapping, and the input must
// hold the placeholder 0 there. count is how many images the request has had before these
// (the limit is per request); it returns the new count.
func Check(model *loopsv1.ModelInfo, images []*loopsv1.Image, tokens []int32, count int) (int, error) {
	if len(images) == 0 {
		return count, nil
	}
	if err := Accepts(model, "send encoded_text chunks"); err != nil {
		return 0, err
	}
	next := 0
	for i, im := range images {
		count++
		if count > MaxImages {
			return 0, fmt.Errorf("the request has more than %d images, the limit: split it", MaxImages)
		}
		w, h, err := Header(im.GetData(), im.GetFormat())
		if err != nil {
			return 0, fmt.Errorf("image %d: %v", i, err)
		}
		if int(im.GetWidth()) != w || int(im.GetHeight()) != h {
			return 0, fmt.Errorf("image %d says %d×%d pixels but its header says %d×%d", i, im.GetWidth(), im.GetHeight(), w, h)
		}
		want, err := Tokens(model.GetVision(), w, h)
		if err != nil {
			return 0, err
		}
		if int(im.GetTokens()) != want {
			return 0, fmt.Errorf("image %d (%d×%d pixels) has expected_tokens %d, but %s's image processor makes %d tokens of it: set expected_tokens to %d", i, w, h, im.GetTokens(), model.GetName(), want, want)
		}
		off := int(im.GetOffset())
		if off < next || off+want > len(tokens) {
			return 0, fmt.Errorf("image %d at positions [%d, %d) is outside the %d-token input or overlaps the image before it", i, off, off+want, len(tokens))
		}
		for j := off; j < off+want; j++ {
			if tokens[j] != 0 {
				return 0, fmt.Errorf("image %d: position %d holds token %d, not the placeholder 0", i, j, tokens[j])
			}
		}
		next = off + want
	}
	return count, nil
}
