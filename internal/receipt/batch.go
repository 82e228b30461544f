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

// hashWriter appends the encoding into a buffer that it hands to the hash in blocks (one
// Write per element would cost more than the hashing).
type hashWriter struct {
	h   hash.Hash
	buf []byte
}

func (w *hashWriter) flushIfFull() {
	if len(w.buf) >= 1<<16 {
		w.h.Write(w.buf)
		w.buf = w.buf[:0]
	}
}

func (w *hashWriter) u64(v uint64) {
	w.buf = binary.LittleEndian.AppendUint64(w.buf, v)
	w.flushIfFull()
}
func (w *hashWriter) bytes(b []byte) { w.buf = append(w.buf, b...); w.flushIfFull() }

func writeBatch(h hash.Hash, data []*loopsv1.Datum) {
	w := &hashWriter{h: h, buf: make([]byte, 0, 1<<16+4096)}
	w.bytes([]byte(BatchEncoding + "\n"))
	w.u64(uint64(len(data)))
	for _, d := range data {
		toks := d.GetTokens()
		w.u64(uint64(len(toks)))
		for _, t := range toks {
			w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(t))
			w.flushIfFull()
		}
		in := d.GetLossFnInputs()
		names := make([]string, 0, len(in))
		for k := range in {
			names = append(names, k)
		}
		slices.Sort(names)
		w.u64(uint64(len(names)))
		for _, k := range names {
			t := in[k]
			w.u64(uint64(len(k)))
			w.bytes([]byte(k))
			w.bytes([]byte{byte(t.GetDtype())})
			f, i := t.GetFloat32Data(), t.GetInt64Data()
			shape := t.GetShape()
			if len(shape) == 0 {
				shape = []int64{int64(len(f) + len(i))}
			}
			w.u64(uint64(len(shape)))
			for _, s := range shape {
				w.u64(uint64(s))
			}
			// A tensor holds one of the two (validation refuses both); both are hashed, in
			// this order, so that no two different tensors share an encoding.
			w.u64(uint64(len(f)))
			for _, v := range f {
				w.buf = binary.LittleEndian.AppendUint32(w.buf, math.Float32bits(v))
				w.flushIfFull()
			}
			w.u64(uint64(len(i)))
			for _, v := range i {
				w.buf = binary.LittleEndian.AppendUint64(w.buf, uint64(v))
				w.flushIfFull()
			}
		}
	}
	h.Write(w.buf)
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
