package infer

import (
	"encoding/base64"
	"strings"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/vision"
)

// Image is an image of a chat message, checked by vision.Header: its encoded bytes, their
// format ("png" or "jpeg") and its size in pixels.
type Image struct {
	Data          []byte
	Format        string
	Width, Height int
}

// Part is one content part of a message that holds images: its Text, or its Image when
// Image is not nil.
type Part struct {
	Text  string
	Image *Image
}

// mediaTypes are the MIME types of the formats Loops serves (vision.Formats).
var mediaTypes = map[string]string{"image/png": "png", "image/jpeg": "jpeg"}

// maxEncoded is the most base64 characters an image of vision.MaxBytes bytes takes: a
// longer one is refused before it is decoded.
var maxEncoded = base64.StdEncoding.EncodedLen(vision.MaxBytes)

// DecodeImage decodes a base64 image of media type mediaType ("image/png" or
// "image/jpeg") and checks it (vision.Header: its size, that the bytes are the format, its
// pixel size from its header) before anything else is done with it; param names it.
func DecodeImage(mediaType, data, param string) (*Image, error) {
	format, ok := mediaTypes[mediaType]
	if !ok {
		return nil, BadField(param, "%s: media type %q is not served: send image/png or image/jpeg", param, Truncate(mediaType))
	}
	if len(data) > maxEncoded {
		return nil, BadField(param, "%s: the image is %d base64 characters, more than an image of the limit of %d bytes (8 MiB) takes: send a smaller or more compressed image", param, len(data), vision.MaxBytes)
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, BadField(param, "%s: the image data is not valid base64: %v", param, err)
	}
	w, h, err := vision.Header(b, format)
	if err != nil {
		return nil, BadField(param, "%s: %v", param, err)
	}
	return &Image{Data: b, Format: format, Width: w, Height: h}, nil
}

// DecodeImageURL decodes an image given as a URL: only a data URL,
// data:image/png;base64,… or data:image/jpeg;base64,…, since Loops fetches no URLs.
func DecodeImageURL(url, param string) (*Image, error) {
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		scheme, _, _ := strings.Cut(url, ":")
		return nil, BadField(param, "%s: Loops fetches no URLs (got a %q URL): send the image's bytes as a data URL, data:image/png;base64,… or data:image/jpeg;base64,…", param, Truncate(scheme))
	}
	head, data, ok := strings.Cut(rest, ",")
	mediaType, enc, _ := strings.Cut(head, ";")
	if !ok || enc != "base64" {
		return nil, BadField(param, "%s: a data URL must be data:<media type>;base64,<data>, e.g. data:image/png;base64,…", param)
	}
	return DecodeImage(mediaType, data, param)
}

// Images are the images of msgs, in order.
func Images(msgs []Message) []*Image {
	var out []*Image
	for _, m := range msgs {
		for _, p := range m.Parts {
			if p.Image != nil {
				out = append(out, p.Image)
			}
		}
	}
	return out
}

// expandImages turns the images' placeholders in toks (token imageToken, once per image,
// where the chat template put each) into the image's tokens: n positions holding the
// placeholder 0, with the image at their offset (as a Tinker image chunk lays it out).
// sizes[i] is image i's token count.
func expandImages(toks []int32, imgs []*Image, sizes []int, imageToken int32) ([]int32, []*loopsv1.Image, error) {
	found := 0
	for _, t := range toks {
		if t == imageToken {
			found++
		}
	}
	if found != len(imgs) {
		return nil, nil, BadField("messages", "the messages hold %d images, but the model's chat template rendered %d image placeholders (token %d): the template must render every image part, and text must not hold the image placeholder itself", len(imgs), found, imageToken)
	}
	extra := 0
	for _, n := range sizes {
		extra += n - 1
	}
	out := make([]int32, 0, len(toks)+extra)
	pos := make([]*loopsv1.Image, 0, len(imgs))
	for _, t := range toks {
		if t != imageToken {
			out = append(out, t)
			continue
		}
		i := len(pos)
		im := imgs[i]
		pos = append(pos, &loopsv1.Image{Data: im.Data, Format: im.Format, Offset: int32(len(out)), Tokens: int32(sizes[i]),
			Width: int32(im.Width), Height: int32(im.Height)})
		out = append(out, make([]int32, sizes[i])...)
	}
	return out, pos, nil
}

// imageSizes checks that model takes imgs and returns the tokens each takes
// (vision.Tokens), and their sum.
func imageSizes(info *loopsv1.ModelInfo, imgs []*Image) ([]int, int, error) {
	if err := vision.Accepts(info, "send text content only"); err != nil {
		return nil, 0, BadField("messages", "%v", err)
	}
	if len(imgs) > vision.MaxImages {
		return nil, 0, BadField("messages", "the messages hold %d images, over the limit of %d per request: send fewer", len(imgs), vision.MaxImages)
	}
	if info.GetVision().GetImageTokenId() <= 0 {
		return nil, 0, BadField("model", "model %s takes images, but its catalog entry gives no image token id (vision.image_token_id) to place them in its chat template: send them as Tinker image chunks", info.GetName())
	}
	sizes := make([]int, len(imgs))
	sum := 0
	for i, im := range imgs {
		n, err := vision.Tokens(info.GetVision(), im.Width, im.Height)
		if err != nil {
			return nil, 0, BadField("messages", "model %s: %v", info.GetName(), err)
		}
		sizes[i], sum = n, sum+n
	}
	return sizes, sum, nil
}
