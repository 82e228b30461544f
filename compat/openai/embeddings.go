package openai

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"

	"github.com/loops-dev/loops/compat/internal/infer"
)

// The bounds of one POST /embeddings request, checked before any work (each input is also
// bounded by the model's max_sequence_length). Every input is one sample on the core,
// queued and limited with the workspace's other samples.
const (
	// MaxEmbeddingInputs caps the inputs of one request.
	MaxEmbeddingInputs = 128
	// MaxEmbeddingTokens caps the tokens of one request's inputs together.
	MaxEmbeddingTokens = 65536
)

// embeddingRequest is a decoded POST /embeddings body.
type embeddingRequest struct {
	model      string
	inputs     []prompt
	base64     bool
	dimensions int64 // 0: not given
}

// decodeEmbeddingRequest decodes and range-checks the body of POST /embeddings.
func decodeEmbeddingRequest(b []byte) (*embeddingRequest, error) {
	fields, err := infer.DecodeObject(b, "")
	if err != nil {
		return nil, err
	}
	req := &embeddingRequest{}
	hasInput := false
	for _, name := range infer.SortedKeys(fields) {
		raw := fields[name]
		if infer.IsNull(raw) {
			continue // OpenAI's clients send null for "not given"
		}
		switch name {
		case "model":
			if req.model, err = infer.Str(raw, name); err != nil {
				return nil, err
			}
		case "input":
			if req.inputs, err = decodePrompts(raw, name); err != nil {
				return nil, err
			}
			hasInput = true
		case "encoding_format":
			f, err := infer.Str(raw, name)
			if err != nil {
				return nil, err
			}
			switch f {
			case "float":
			case "base64":
				req.base64 = true
			default:
				return nil, badField(name, "encoding_format must be \"float\" or \"base64\", got %q", infer.Truncate(f))
			}
		case "dimensions":
			if req.dimensions, err = infer.Integer(raw, name, 1, math.MaxInt32); err != nil {
				return nil, err
			}
		case "user":
			if _, err := infer.Str(raw, name); err != nil {
				return nil, err
			}
		default:
			return nil, unsupported(name, "POST embeddings takes model, input, encoding_format, dimensions and user")
		}
	}
	switch {
	case req.model == "":
		return nil, badField("model", "model is required")
	case !hasInput:
		return nil, badField("input", "input is required")
	}
	return req, nil
}

type embeddingItem struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type embeddingResponse struct {
	Object string          `json:"object"`
	Data   []embeddingItem `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingUsage  `json:"usage"`
}

// embeddings serves POST /embeddings: per input, the mean over its tokens of the model's
// final hidden state (SampleRequest.embed), as float32 numbers or, with encoding_format
// base64, their little-endian bytes in base64 (as OpenAI's).
func (s *server) embeddings(w http.ResponseWriter, r *http.Request) error {
	b, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := decodeEmbeddingRequest(b)
	if err != nil {
		return err
	}
	in := make([]infer.Prompt, len(req.inputs))
	for i, p := range req.inputs {
		in[i] = infer.Prompt{Text: p.text}
		if p.hasTokens {
			in[i].Tokens = p.tokens
		}
	}
	out, err := s.engine.Embed(r.Context(), req.model, "input", in, int(req.dimensions),
		infer.EmbedLimits{MaxInputs: MaxEmbeddingInputs, MaxTotalTokens: MaxEmbeddingTokens})
	if err != nil {
		return err
	}
	resp := embeddingResponse{Object: "list", Model: req.model, Data: make([]embeddingItem, len(out.Vectors)),
		Usage: embeddingUsage{PromptTokens: out.PromptTokens, TotalTokens: out.PromptTokens}}
	for i, v := range out.Vectors {
		item := embeddingItem{Object: "embedding", Index: i, Embedding: v}
		if req.base64 {
			buf := make([]byte, 4*len(v))
			for j, f := range v {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(f))
			}
			item.Embedding = base64.StdEncoding.EncodeToString(buf)
		}
		resp.Data[i] = item
	}
	s.edge.WriteJSON(w, http.StatusOK, resp)
	return nil
}
