package receipt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// BatchEncoding names the canonical batch encoding that BatchHash hashes.
const BatchEncoding = "loops-batch-v1"

// BatchHash returns "sha256:<hex>" of the canonical encoding (loops-batch-v1) of a batch's
// decoded values, so that the same datums hash the same whatever wire format, JSON key order
// or float formatting carried them. The encoding, all integers little-endian:
//
//	"loops-batch-v1\n"
//	u64 number of datums, then for each datum:
//	  u64 number of model input tokens, each as i32
//	  u64 number of loss inputs, then for each, in bytewise order of its name:
//	    u64 length of the name, the name's UTF-8 bytes
//	    u8 dtype (1 float32, 2 int64, the loops.v1.Dtype number)
//	    u64 rank, each dimension as i64 (an empty shape is written as the 1-D [n])
//	    u64 number of elements, each as its IEEE-754 float32 bits or as i64
//
// Floats are hashed by their bits: -0 and 0 differ, as they may in the engine's result.
func BatchHash(data []*loopsv1.Datum) string {
	h := sha256.New()
	writeBatch(h, data)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func writeBatch(h hash.Hash, data []*loopsv1.Datum) {
	var buf [8]byte
	u64 := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	h.Write([]byte(BatchEncoding + "\n"))
	u64(uint64(len(data)))
	for _, d := range data {
		toks := d.GetTokens()
		u64(uint64(len(toks)))
		for _, t := range toks {
			binary.LittleEndian.PutUint32(buf[:4], uint32(t))
			h.Write(buf[:4])
		}
		in := d.GetLossFnInputs()
		names := make([]string, 0, len(in))
		for k := range in {
			names = append(names, k)
		}
		slices.Sort(names)
		u64(uint64(len(names)))
		for _, k := range names {
			t := in[k]
			u64(uint64(len(k)))
			h.Write([]byte(k))
			h.Write([]byte{byte(t.GetDtype())})
			f, i := t.GetFloat32Data(), t.GetInt64Data()
			n := len(f) + len(i)
			shape := t.GetShape()
			if len(shape) == 0 {
				shape = []int64{int64(n)}
			}
			u64(uint64(len(shape)))
			for _, s := range shape {
				u64(uint64(s))
			}
			// A tensor holds one of the two (validation refuses both); both are hashed, in
			// this order, so that no two different tensors share an encoding.
			u64(uint64(len(f)))
			for _, v := range f {
				binary.LittleEndian.PutUint32(buf[:4], math.Float32bits(v))
				h.Write(buf[:4])
			}
			u64(uint64(len(i)))
			for _, v := range i {
				u64(uint64(v))
			}
		}
	}
}

// MaxBatchBytes bounds a stored batch that DecodeBatch reads.
const MaxBatchBytes = 256 << 20

// EncodeBatch returns the stored form of a recorded batch: the loops.v1.ReceiptBatch
// message in protobuf's deterministic encoding, batch_sha256 set.
func EncodeBatch(b *loopsv1.ReceiptBatch) ([]byte, error) {
	b = proto.CloneOf(b)
	b.BatchSha256 = BatchHash(b.GetData())
	return proto.MarshalOptions{Deterministic: true}.Marshal(b)
}

// DecodeBatch reads a stored batch (EncodeBatch) and sets its batch_sha256 to the hash of
// the datums it holds now, so a batch changed since it was recorded shows a hash other
// than its step's.
func DecodeBatch(data []byte) (*loopsv1.ReceiptBatch, error) {
	if len(data) > MaxBatchBytes {
		return nil, fmt.Errorf("stored batch is %d bytes, more than the %d a batch may be", len(data), MaxBatchBytes)
	}
	b := &loopsv1.ReceiptBatch{}
	if err := proto.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("stored batch is not a loops.v1.ReceiptBatch: %w", err)
	}
	if b.GetSeqId() <= 0 {
		return nil, errors.New("stored batch has no seq_id")
	}
	b.BatchSha256 = BatchHash(b.GetData())
	return b, nil
}
