package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// image is a safetensors file: the header length field n, the header, then data.
func image(n uint64, header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, n)
	return append(append(b, header...), data...)
}

// img is image with the true header length.
func img(header string, data []byte) []byte { return image(uint64(len(header)), header, data) }

func parse(b []byte, lim Limits) (*File, error) { return Parse(bytes.NewReader(b), int64(len(b)), lim) }

func TestWriteThenOpen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	n, err := Write(p, []Tensor{{Name: "b", Shape: []int64{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "a", Shape: []int64{0}, Data: nil}, {Name: "s", Shape: []int64{}, Data: []float32{7}}},
		map[string]string{"format": "pt"})
	require.NoError(t, err)
	st, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, st.Size(), n)
	f, err := OpenLimited(p, Limits{MaxHeaderBytes: 1 << 10, MaxTensors: 3, DTypes: FloatDTypes})
	require.NoError(t, err)
	defer f.Close()
	require.Equal(t, map[string]string{"format": "pt"}, f.Metadata)
	d, shape, err := f.ReadFloat32("b")
	require.NoError(t, err)
	require.Equal(t, []int64{2, 3}, shape)
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6}, d)
	d, _, err = f.ReadFloat32("s")
	require.NoError(t, err)
	require.Equal(t, []float32{7}, d)
	d, _, err = f.ReadFloat32("a")
	require.NoError(t, err)
	require.Empty(t, d)
}

func TestParseReadsOtherDTypes(t *testing.T) {
	// BF16 1.0 and F16 -2.0, stored out of name order, and an integer tensor that Parse
	// accepts but ReadFloat64 does not convert
	b := img(`{"h":{"dtype":"F16","shape":[1],"data_offsets":[2,4]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"i":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}}`,
		[]byte{0x80, 0x3f, 0x00, 0xc0, 1, 0, 0, 0, 0, 0, 0, 0})
	f, err := parse(b, Limits{})
	require.NoError(t, err)
	d, _, err := f.ReadFloat64("a")
	require.NoError(t, err)
	require.Equal(t, []float64{1}, d)
	d, _, err = f.ReadFloat64("h")
	require.NoError(t, err)
	require.Equal(t, []float64{-2}, d)
	_, _, err = f.ReadFloat64("i")
	require.ErrorContains(t, err, "unsupported dtype I64")
}

// Every header field is checked against the file and the limits before anything sized by
// it is allocated.
func TestParseRefusesBadHeaders(t *testing.T) {
	eight := make([]byte, 8)
	t1 := `{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	big := bytes.Repeat([]byte{' '}, 2000)
	for _, tc := range []struct {
		name string
		b    []byte
		lim  Limits
		want string
	}{
		{"empty file", nil, Limits{}, "too short"},
		{"header length 2^63", image(1<<63, "{}", nil), Limits{}, "larger than the file"},
		{"header length 2^64-1", image(1<<64-1, "{}", nil), Limits{}, "larger than the file"},
		{"header length beyond the file", image(99<<20, "{}", nil), Limits{}, "larger than the file"},
		{"header above the limit", img(`{}`+string(big), nil), Limits{MaxHeaderBytes: 1000}, "larger than the limit of 1000"},
		{"not an object", img(`[1]`, nil), Limits{}, "not a JSON object"},
		{"not JSON", img(`{"t":`, nil), Limits{}, "bad header"},
		{"trailing data", img(`{}{}`, nil), Limits{}, "data after the JSON object"},
		{"duplicate tensor", img(`{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), Limits{}, "appears twice"},
		{"duplicate metadata", img(`{"__metadata__":{},"__metadata__":{}}`, nil), Limits{}, "appears twice"},
		{"metadata not strings", img(`{"__metadata__":{"step":3}}`, nil), Limits{}, "must map strings to strings"},
		{"unknown dtype", img(`{"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}`, eight), Limits{}, `unknown dtype "Q4"`},
		{"dtype not allowed", img(`{"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}`, eight), Limits{DTypes: FloatDTypes}, "dtype I32 is not allowed"},
		{"negative dimension", img(`{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), Limits{}, "negative dimension"},
		{"shape overflowing int64", img(`{"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, eight), Limits{}, "too large"},
		{"shape overflowing by the element size", img(`{"t":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}}`, eight), Limits{}, "too large"},
		{"dimension not an integer", img(`{"t":{"dtype":"F32","shape":[1e30],"data_offsets":[0,8]}}`, eight), Limits{}, "bad header"},
		{"three offsets", img(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}}`, eight), Limits{}, "must hold 2 numbers"},
		{"offsets not matching the shape", img(`{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), Limits{}, "do not hold the 12 bytes"},
		{"negative offset", img(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, eight), Limits{}, "data_offsets [-8, 0]"},
		{"huge shape and matching offsets", img(`{"t":{"dtype":"F32","shape":[1073741824,1024],"data_offsets":[0,4398046511104]}}`, eight), Limits{}, "data section holds 8"},
		{"offsets past the end of the file", img(t1, eight[:4]), Limits{}, "data section holds 4"},
		{"overlapping offsets", img(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), Limits{}, "overlap"},
		{"a gap", img(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), Limits{}, "gap"},
		{"trailing bytes", img(t1, append(eight, 0)), Limits{}, "data section holds 9"},
		{"too many tensors", img(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), Limits{MaxTensors: 1}, "more than 1 tensors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc := allocDuring(func() { _, err = parse(tc.b, tc.lim) })
			require.ErrorContains(t, err, tc.want)
			require.Less(t, alloc, uint64(1<<20), "refusing the header allocated %d bytes", alloc)
		})
	}
}

func TestOpenRefusesHugeHeaderLengthWithoutAllocating(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	require.NoError(t, os.WriteFile(p, image(99<<20, "{}", nil), 0o644))
	var err error
	alloc := allocDuring(func() { _, err = Open(p) })
	require.ErrorContains(t, err, "larger than the file")
	require.Less(t, alloc, uint64(1<<20))
}

func allocDuring(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// FuzzParse fails on any panic, and on a header Parse accepts whose tensors do not tile
// the file or cannot be read back.
func FuzzParse(f *testing.F) {
	p := filepath.Join(f.TempDir(), "seed.safetensors")
	_, err := Write(p, []Tensor{{Name: "w", Shape: []int64{2, 2}, Data: []float32{1, 2, 3, 4}}, {Name: "v", Shape: []int64{1}, Data: []float32{5}}}, map[string]string{"step": "3"})
	require.NoError(f, err)
	valid, err := os.ReadFile(p)
	require.NoError(f, err)
	f.Add(valid)
	f.Add(img(`{"h":{"dtype":"F16","shape":[1],"data_offsets":[2,4]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`, []byte{0x80, 0x3f, 0, 0xc0}))
	f.Add(image(1<<63, "{}", nil))
	f.Add(img(`{"t":{"dtype":"F32","shape":[1073741824,1024],"data_offsets":[0,4398046511104]}}`, make([]byte, 8)))
	f.Add(img(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(img(`{"__metadata__":{"step":3}}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(bytes.NewReader(b), int64(len(b)), Limits{MaxHeaderBytes: 1 << 16, MaxTensors: 64})
		if err != nil {
			return
		}
		var total int64
		for name, info := range file.Tensors {
			require.LessOrEqual(t, info.Offsets[1], int64(len(b))-file.base, name)
			total += info.Offsets[1] - info.Offsets[0]
			d, shape, err := file.ReadFloat64(name)
			if err != nil {
				require.NotContains(t, FloatDTypes, info.DType, "%s: %v", name, err)
				continue
			}
			require.Equal(t, Numel(shape), int64(len(d)), name)
		}
		require.Equal(t, int64(len(b))-file.base, total, "the tensors do not tile the data section")
	})
}

// TestReadFloat32IsFloat32OfReadFloat64: for every float dtype, random bit patterns
// (NaNs, infinities and subnormals among them) read as float32 have the bits of float32
// of the float64 read, also when the tensor spans several read chunks.
func TestReadFloat32IsFloat32OfReadFloat64(t *testing.T) {
	defer func(n int64) { readChunkBytes = n }(readChunkBytes)
	r := rand.New(rand.NewPCG(5, 6))
	for _, chunk := range []int64{4 << 20, 24, 7} {
		readChunkBytes = chunk
		for _, dt := range FloatDTypes {
			es := elemSizes[dt]
			const n = 301
			data := make([]byte, n*es)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			// a signalling NaN and an infinity in the first elements of each width
			switch dt {
			case "F32":
				binary.LittleEndian.PutUint32(data, 0x7f800001)
				binary.LittleEndian.PutUint32(data[4:], 0xff800000)
			case "BF16":
				binary.LittleEndian.PutUint16(data, 0x7f81)
			case "F16":
				binary.LittleEndian.PutUint16(data, 0x7c01)
			case "F64":
				binary.LittleEndian.PutUint64(data, 0x7ff0000000000001)
			}
			hdr := fmt.Sprintf(`{"x":{"dtype":%q,"shape":[%d],"data_offsets":[0,%d]}}`, dt, n, len(data))
			f, err := parse(img(hdr, data), Limits{})
			require.NoError(t, err)
			d64, _, err := f.ReadFloat64("x")
			require.NoError(t, err)
			d32, _, err := f.ReadFloat32("x")
			require.NoError(t, err)
			require.Len(t, d32, n)
			for i, v := range d64 {
				require.Equal(t, math.Float32bits(float32(v)), math.Float32bits(d32[i]), "%s element %d, chunk %d", dt, i, chunk)
			}
		}
	}
}
