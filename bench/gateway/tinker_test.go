package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	publicv1 "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

// tinkerClient calls a gateway's Tinker routes as the SDK sends them: protobuf
// forward_backward, JSON optim_step, retrieve_future long-polls, on one training run of
// loops/tiny (LoRA rank 8, attention + MLP).
type tinkerClient struct {
	t       *testing.T
	ctx     context.Context
	url     string
	model   string
	seq     int32
	fbBody  func(seq int32) []byte
	headers http.Header
}

// newTinkerClient creates a session and a training run on the gateway at url; d is the
// datum every forward_backward sends. headers go on every request (a traceparent).
func newTinkerClient(t *testing.T, url string, d *loopsv1.Datum, headers http.Header) *tinkerClient {
	c := &tinkerClient{t: t, ctx: t.Context(), url: url, seq: 1, headers: headers}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	require.NoError(t, json.Unmarshal(c.post("create_session", "application/json", []byte(`{"tags":[],"user_metadata":{},"sdk_version":"0.38.0"}`), ""), &sess))
	var model struct {
		ModelID string `json:"model_id"`
	}
	b := c.result(c.post("create_model", "application/json", fmt.Appendf(nil, `{"session_id":%q,"model_seq_id":0,"base_model":"loops/tiny","lora_config":{"rank":8,"train_attn":true,"train_mlp":true,"train_unembed":false}}`, sess.SessionID), ""), "")
	require.NoError(t, json.Unmarshal(b, &model))
	c.model = model.ModelID

	tok := make([]byte, 4*len(d.Tokens))
	for i, x := range d.Tokens {
		binary.LittleEndian.PutUint32(tok[4*i:], uint32(x))
	}
	tgt := make([]byte, 8*len(d.Tokens))
	w := make([]byte, 4*len(d.Tokens))
	for i := range d.Tokens {
		binary.LittleEndian.PutUint64(tgt[8*i:], uint64(d.LossFnInputs["target_tokens"].Int64Data[i]))
		binary.LittleEndian.PutUint32(w[4*i:], 0x3f800000)
	}
	c.fbBody = func(seq int32) []byte {
		body, err := proto.Marshal(&publicv1.ForwardBackwardRequest{ModelId: c.model, SeqId: seq, LossFn: "cross_entropy", Data: []*publicv1.Datum{{
			ModelInput: []*publicv1.Chunk{{Chunk: &publicv1.Chunk_EncodedText{EncodedText: &publicv1.EncodedTextChunk{Tokens: tok}}}},
			LossFnInputs: map[string]*publicv1.Tensor{
				"target_tokens": {Encoding: &publicv1.Tensor_Dense{Dense: tgt}, Dtype: publicv1.DType_DTYPE_INT64, Shape: []int64{int64(len(d.Tokens))}},
				"weights":       {Encoding: &publicv1.Tensor_Dense{Dense: w}, Dtype: publicv1.DType_DTYPE_FLOAT32, Shape: []int64{int64(len(d.Tokens))}},
			},
		}}})
		require.NoError(t, err)
		return body
	}
	return c
}

func (c *tinkerClient) post(path, ctype string, body []byte, accept string) []byte {
	req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, c.url+"/api/v1/"+path, bytes.NewReader(body))
	for k, v := range c.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("X-API-Key", "tml-bench")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(c.t, http.StatusOK, resp.StatusCode, string(b))
	return b
}

// result long-polls the future a submission answered and returns its result.
func (c *tinkerClient) result(sub []byte, accept string) []byte {
	var f struct {
		RequestID string `json:"request_id"`
	}
	require.NoError(c.t, json.Unmarshal(sub, &f))
	for {
		b := c.post("retrieve_future", "application/json", fmt.Appendf(nil, `{"request_id":%q}`, f.RequestID), accept)
		if !bytes.Contains(b, []byte(`"try_again"`)) {
			return b
		}
	}
}

// forwardBackward submits the next forward_backward and waits for its result.
func (c *tinkerClient) forwardBackward() {
	body := c.fbBody(c.seq)
	c.seq++
	c.result(c.post("forward_backward", "application/x-protobuf", body, ""), "application/x-protobuf")
}

// optimStep submits the next optim_step and waits for its result.
func (c *tinkerClient) optimStep() {
	seq := c.seq
	c.seq++
	c.result(c.post("optim_step", "application/json", fmt.Appendf(nil, `{"model_id":%q,"seq_id":%d,"adam_params":{"learning_rate":0.0001,"beta1":0.9,"beta2":0.95,"eps":1e-12,"weight_decay":0,"grad_clip_norm":0}}`, c.model, seq), ""), "")
}
