package receipt

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func decodeDatums(t *testing.T, js string) []*loopsv1.Datum {
	t.Helper()
	var b loopsv1.ReceiptBatch
	require.NoError(t, protojson.Unmarshal([]byte(js), &b))
	return b.GetData()
}

// The hash is of the decoded values: key order, float spelling and an explicit 1-D shape
// do not change it; any value does.
func TestBatchHashIsOfValues(t *testing.T) {
	a := decodeDatums(t, `{"data":[{"tokens":[1,2,3],"loss_fn_inputs":{
		"target_tokens":{"dtype":"DTYPE_INT64","int64_data":["2","3","4"]},
		"weights":{"dtype":"DTYPE_FLOAT32","float32_data":[1,0.5,0.25]}}}]}`)
	b := decodeDatums(t, `{"data":[{"loss_fn_inputs":{
		"weights":{"float32_data":[1.0e0,5E-1,0.250000],"shape":["3"],"dtype":"DTYPE_FLOAT32"},
		"target_tokens":{"int64_data":[2,3,4],"dtype":"DTYPE_INT64"}},"tokens":[1,2,3]}]}`)
	require.Equal(t, BatchHash(a), BatchHash(b))

	changed := []func(d *loopsv1.Datum){
		func(d *loopsv1.Datum) { d.Tokens[0] = 9 },
		func(d *loopsv1.Datum) { d.LossFnInputs["weights"].Float32Data[2] = 0.25000003 },
		func(d *loopsv1.Datum) { d.LossFnInputs["weights"].Shape = []int64{1, 3} },
		func(d *loopsv1.Datum) {
			d.LossFnInputs["w"] = d.LossFnInputs["weights"]
			delete(d.LossFnInputs, "weights")
		},
		func(d *loopsv1.Datum) { d.Tokens = append(d.Tokens, 0) },
		func(d *loopsv1.Datum) {
			// the same numbers as the other dtype
			d.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: []float32{2, 3, 4}}
		},
	}
	seen := map[string]bool{BatchHash(a): true}
	for i, f := range changed {
		c := []*loopsv1.Datum{proto.CloneOf(a[0])}
		f(c[0])
		h := BatchHash(c)
		require.False(t, seen[h], "change %d kept a hash already seen", i)
		seen[h] = true
	}
	// Two datums are not one with their tokens joined.
	one := decodeDatums(t, `{"data":[{"tokens":[1,2]}]}`)
	two := decodeDatums(t, `{"data":[{"tokens":[1]},{"tokens":[2]}]}`)
	require.NotEqual(t, BatchHash(one), BatchHash(two))
}

// The encoding is the documented one: an independent computation of a small batch.
func TestBatchHashEncoding(t *testing.T) {
	d := []*loopsv1.Datum{{Tokens: []int32{7}, LossFnInputs: map[string]*loopsv1.Tensor{
		"w": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: []float32{1}},
	}}}
	le := func(n int, v uint64) []byte {
		out := make([]byte, n)
		for i := range n {
			out[i] = byte(v >> (8 * i))
		}
		return out
	}
	var enc []byte
	enc = append(enc, "loops-batch-v1\n"...)
	enc = append(enc, le(8, 1)...)          // datums
	enc = append(enc, le(8, 1)...)          // tokens
	enc = append(enc, le(4, 7)...)          // token 7
	enc = append(enc, le(8, 1)...)          // loss inputs
	enc = append(enc, le(8, 1)...)          // name length
	enc = append(enc, 'w', 1)               // name, dtype float32
	enc = append(enc, le(8, 1)...)          // rank
	enc = append(enc, le(8, 1)...)          // dimension
	enc = append(enc, le(8, 1)...)          // float32 elements
	enc = append(enc, le(4, 0x3f800000)...) // 1.0f
	enc = append(enc, le(8, 0)...)          // int64 elements
	sum := sha256.Sum256(enc)
	require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), BatchHash(d))
}

func TestBatchRoundTrip(t *testing.T) {
	b := &loopsv1.ReceiptBatch{TrainingRunId: "run-1", SeqId: 4, LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 0.7},
		Data: []*loopsv1.Datum{{Tokens: []int32{1, 2}, LossFnInputs: map[string]*loopsv1.Tensor{"advantages": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: []float32{0, 1}}}}}}
	blob, err := EncodeBatch(b)
	require.NoError(t, err)
	got, err := DecodeBatch(blob)
	require.NoError(t, err)
	want := proto.CloneOf(b)
	want.BatchSha256 = BatchHash(b.GetData())
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()))
	_, err = DecodeBatch([]byte{0xff})
	require.ErrorContains(t, err, "not a loops.v1.ReceiptBatch")
	_, err = DecodeBatch(nil)
	require.ErrorContains(t, err, "no seq_id")
}

func TestClientFromHeaders(t *testing.T) {
	// What tinker 0.38.0 sends (tinker/_base_client.py: default_headers, platform_headers).
	h := http.Header{}
	h.Set("User-Agent", "AsyncTinker/Python 0.38.0")
	h.Set("X-Stainless-Package-Version", "0.38.0")
	h.Set("X-Stainless-Runtime", "CPython")
	h.Set("X-Stainless-Runtime-Version", "3.11.9")
	h.Set("X-Stainless-OS", "Linux")
	require.Empty(t, cmp.Diff(&loopsv1.ClientInfo{Name: "tinker", Version: "0.38.0", Runtime: "CPython 3.11.9", UserAgent: "AsyncTinker/Python 0.38.0"},
		ClientFromHeaders(h), protocmp.Transform()))
	h = http.Header{}
	h.Set("User-Agent", "Tinker/Python 0.24.1")
	require.Equal(t, "0.24.1", ClientFromHeaders(h).GetVersion())
	h = http.Header{}
	h.Set("User-Agent", "curl/8.5.0")
	require.Empty(t, cmp.Diff(&loopsv1.ClientInfo{Name: "curl", Version: "8.5.0", UserAgent: "curl/8.5.0"}, ClientFromHeaders(h), protocmp.Transform()))
	require.Nil(t, ClientFromHeaders(http.Header{}))
	h.Set("User-Agent", string(make([]byte, 1000)))
	require.Len(t, ClientFromHeaders(h).GetUserAgent(), maxHeader)
}

func TestDirRevision(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600))
	}
	write("config.json", "{}")
	write("model.safetensors", "weights")
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	want := sha256.Sum256([]byte(sum("{}") + "  config.json\n" + sum("weights") + "  model.safetensors\n"))
	rev, err := DirRevision(dir)
	require.NoError(t, err)
	require.Equal(t, "sha256:"+hex.EncodeToString(want[:]), rev)
	// The torch worker's loops_worker/revision.py gives the same (its test_revision.py).
	require.Equal(t, "sha256:4d29798c6e59eb7dfc2b375b8998040ed29cf33c98038b41e9717a6c37f5dad7", rev)

	write(".cache/x", "ignored")
	again, err := DirRevision(dir)
	require.NoError(t, err)
	require.Equal(t, rev, again)
	write("model.safetensors", "weightz")
	changed, err := DirRevision(dir)
	require.NoError(t, err)
	require.NotEqual(t, rev, changed)

	// A Hugging Face snapshot's link to a blob named by its SHA-256 is not read.
	hf := t.TempDir()
	blob := filepath.Join(hf, "blobs", sum("weights"))
	require.NoError(t, os.MkdirAll(filepath.Dir(blob), 0o755))
	require.NoError(t, os.WriteFile(blob, []byte("weights"), 0o600))
	snap := filepath.Join(hf, "snapshots", "abc")
	require.NoError(t, os.MkdirAll(snap, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(snap, "config.json"), []byte("{}"), 0o600))
	require.NoError(t, os.Symlink(filepath.Join("..", "..", "blobs", sum("weights")), filepath.Join(snap, "model.safetensors")))
	viaLink, err := DirRevision(snap)
	require.NoError(t, err)
	require.Equal(t, rev, viaLink)
}
