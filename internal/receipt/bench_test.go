package receipt

import (
	"crypto/sha256"
	"testing"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// benchBatch is an SFT batch of 64 datums of 1,024 tokens (target_tokens and weights).
func benchBatch() []*loopsv1.Datum {
	var out []*loopsv1.Datum
	for d := range 64 {
		n := 1024
		toks, tgt, w := make([]int32, n), make([]int64, n), make([]float32, n)
		for i := range n {
			toks[i], tgt[i], w[i] = int32(i+d), int64(i+d+1), 1
		}
		out = append(out, &loopsv1.Datum{Tokens: toks, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}})
	}
	return out
}

// BenchmarkBatchHash is the receipt's cost per forward_backward; BenchmarkBatchMarshal,
// the baseline, encodes the same batch once as protobuf (what recording it costs).
func BenchmarkBatchHash(b *testing.B) {
	data := benchBatch()
	b.SetBytes(int64(proto.Size(&loopsv1.ReceiptBatch{Data: data})))
	for b.Loop() {
		BatchHash(data)
	}
}

func BenchmarkBatchMarshal(b *testing.B) {
	m := &loopsv1.ReceiptBatch{Data: benchBatch()}
	b.SetBytes(int64(proto.Size(m)))
	for b.Loop() {
		if _, err := proto.Marshal(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSHA256 hashes as many bytes as the batch's encoding: the floor of BatchHash.
func BenchmarkSHA256(b *testing.B) {
	buf := make([]byte, 64*1024*(4+8+4)+64*100)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		sha256.Sum256(buf)
	}
}
