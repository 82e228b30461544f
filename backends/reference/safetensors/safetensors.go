package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
)

// DefaultMaxHeaderBytes caps a header when Limits.MaxHeaderBytes is zero (the Rust
// safetensors library caps headers at 100 MB).
const DefaultMaxHeaderBytes = 100 << 20

// FloatDTypes are the dtypes ReadFloat64 converts.
var FloatDTypes = []string{"F32", "F16", "BF16", "F64"}

// elemSizes are the byte sizes of the dtypes of the safetensors specification; any other
// dtype makes a header invalid (sub-byte dtypes such as F4 are not supported).
var elemSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// Limits bound what Open and Parse accept from a header. Everything a header declares is
// checked against them and against the file's size before a tensor is read.
type Limits struct {
	// MaxHeaderBytes caps the JSON header; zero means DefaultMaxHeaderBytes.
	MaxHeaderBytes int64
	// MaxTensors caps the number of tensors; zero means no cap beyond the header size.
	MaxTensors int
	// DTypes, when not empty, lists the only dtypes accepted.
	DTypes []string
}

// Info describes one tensor in a file.
type Info struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// File is an open safetensors file whose header has been validated: every tensor has a
// known dtype, a shape whose byte size matches its offsets, and the tensors tile the data
// section exactly (no gaps, no overlaps, nothing past the end of the file).
type File struct {
	r        io.ReaderAt
	base     int64
	Tensors  map[string]Info
	Metadata map[string]string
}

// Open reads and validates the header of a safetensors file with the default limits.
func Open(path string) (*File, error) { return OpenLimited(path, Limits{}) }

// OpenLimited reads and validates the header of a safetensors file within lim.
func OpenLimited(path string, lim Limits) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	out, err := Parse(f, st.Size(), lim)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

type rawInfo struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// Parse reads and validates the header of the safetensors image of size bytes held by r.
// It allocates no more than the header's size (at most lim.MaxHeaderBytes) and the
// entries it declares (at most lim.MaxTensors). Close on the result closes r when r is an
// io.Closer.
func Parse(r io.ReaderAt, size int64, lim Limits) (*File, error) {
	maxHdr := lim.MaxHeaderBytes
	if maxHdr <= 0 {
		maxHdr = DefaultMaxHeaderBytes
	}
	if size < 8 {
		return nil, fmt.Errorf("file of %d bytes is too short for a safetensors header", size)
	}
	var lb [8]byte
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n > uint64(size-8) {
		return nil, fmt.Errorf("header length %d is larger than the file (%d bytes)", n, size)
	}
	if n > uint64(maxHdr) {
		return nil, fmt.Errorf("header of %d bytes is larger than the limit of %d bytes", n, maxHdr)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("reading header: %w", err)
	}
	dataSize := size - 8 - int64(n)
	out := &File{r: r, base: 8 + int64(n), Tensors: map[string]Info{}, Metadata: map[string]string{}}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("bad header: not a JSON object")
	}
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("bad header: %w", err)
		}
		name, _ := tok.(string)
		if name == "__metadata__" {
			if seenMeta {
				return nil, errors.New("bad header: __metadata__ appears twice")
			}
			seenMeta = true
			if err := dec.Decode(&out.Metadata); err != nil {
				return nil, fmt.Errorf("bad header: __metadata__ must map strings to strings: %w", err)
			}
			if out.Metadata == nil {
				out.Metadata = map[string]string{}
			}
			continue
		}
		if _, dup := out.Tensors[name]; dup {
			return nil, fmt.Errorf("bad header: tensor %q appears twice", name)
		}
		if lim.MaxTensors > 0 && len(out.Tensors) >= lim.MaxTensors {
			return nil, fmt.Errorf("header declares more than %d tensors, the limit", lim.MaxTensors)
		}
		var ri rawInfo
		if err := dec.Decode(&ri); err != nil {
			return nil, fmt.Errorf("bad header: tensor %q: %w", name, err)
		}
		info, err := checkInfo(ri, lim)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		out.Tensors[name] = info
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errors.New("bad header: unterminated JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("bad header: data after the JSON object")
	}
	// The tensors must tile the data section: sorted by offset, each starts where the
	// previous one ends, and the last ends at the end of the file.
	names := make([]string, 0, len(out.Tensors))
	for k := range out.Tensors {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := out.Tensors[names[i]].Offsets, out.Tensors[names[j]].Offsets
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		return a[1] < b[1]
	})
	var end int64
	for _, k := range names {
		o := out.Tensors[k].Offsets
		if o[0] != end {
			if o[0] < end {
				return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap another tensor", k, o[0], o[1])
			}
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a gap after byte %d", k, o[0], o[1], end)
		}
		end = o[1]
	}
	if end != dataSize {
		return nil, fmt.Errorf("the tensors cover %d bytes but the data section holds %d", end, dataSize)
	}
	return out, nil
}

// checkInfo validates one header entry on its own: dtype, shape and offsets.
func checkInfo(ri rawInfo, lim Limits) (Info, error) {
	es, ok := elemSizes[ri.DType]
	if !ok {
		return Info{}, fmt.Errorf("unknown dtype %q", ri.DType)
	}
	if len(lim.DTypes) > 0 && !slices.Contains(lim.DTypes, ri.DType) {
		return Info{}, fmt.Errorf("dtype %s is not allowed here (want one of %v)", ri.DType, lim.DTypes)
	}
	if len(ri.Offsets) != 2 {
		return Info{}, fmt.Errorf("data_offsets must hold 2 numbers, got %d", len(ri.Offsets))
	}
	nbytes, err := byteSize(ri.Shape, es)
	if err != nil {
		return Info{}, err
	}
	b, e := ri.Offsets[0], ri.Offsets[1]
	if b < 0 || e < b || e-b != nbytes {
		return Info{}, fmt.Errorf("data_offsets [%d, %d] do not hold the %d bytes of shape %v %s", b, e, nbytes, ri.Shape, ri.DType)
	}
	return Info{DType: ri.DType, Shape: ri.Shape, Offsets: [2]int64{b, e}}, nil
}

// byteSize is the byte size of a tensor of shape with elements of es bytes, refusing
// negative dimensions and sizes that do not fit in an int64.
func byteSize(shape []int64, es int64) (int64, error) {
	n := es
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %v has a negative dimension", shape)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("shape %v is too large", shape)
		}
		n *= d
	}
	return n, nil
}

// Close closes the file.
func (f *File) Close() error {
	if c, ok := f.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Numel returns the number of elements of a shape.
func Numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// ReadFloat64 reads a tensor converted to float64.
func (f *File) ReadFloat64(name string) ([]float64, []int64, error) {
	return readFloats[float64](f, name)
}

// ReadFloat32 reads a tensor converted to float32: each value is float32 of what
// ReadFloat64 returns (exact for F32, F16 and BF16), without the float64 copy.
func (f *File) ReadFloat32(name string) ([]float32, []int64, error) {
	return readFloats[float32](f, name)
}

// readChunkBytes is how much of a tensor's bytes readFloats holds at a time: the peak of
// a read is the converted tensor plus one chunk.
var readChunkBytes int64 = 4 << 20

// readFloats reads a tensor converted to E, a chunk of its bytes at a time.
func readFloats[E float32 | float64](f *File, name string) ([]E, []int64, error) {
	info, ok := f.Tensors[name]
	if !ok {
		return nil, nil, fmt.Errorf("tensor %q not found", name)
	}
	if !slices.Contains(FloatDTypes, info.DType) {
		return nil, nil, fmt.Errorf("tensor %q: unsupported dtype %s (want F32, F16, BF16 or F64)", name, info.DType)
	}
	es := elemSizes[info.DType]
	nb := info.Offsets[1] - info.Offsets[0] // validated by Parse: numel*es, inside the file
	out := make([]E, nb/es)
	buf := make([]byte, min(nb, max(readChunkBytes/es, 1)*es))
	for off := int64(0); off < nb; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), nb-off)]
		if _, err := f.r.ReadAt(b, f.base+info.Offsets[0]+off); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		o := out[off/es:][:int64(len(b))/es]
		switch info.DType {
		case "F32":
			for i := range o {
				o[i] = E(math.Float32frombits(quiet(binary.LittleEndian.Uint32(b[4*i:]))))
			}
		case "F64":
			for i := range o {
				o[i] = E(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
			}
		case "BF16":
			for i := range o {
				o[i] = E(math.Float32frombits(quiet(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)))
			}
		case "F16":
			for i := range o {
				o[i] = E(math.Float32frombits(quiet(math.Float32bits(F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))))))
			}
		}
	}
	return out, info.Shape, nil
}

// quiet returns the float32 bits x with a signalling NaN made quiet (its quiet bit set),
// as the float64 of the value would be: a float32 read directly gets the bits that
// float32 of the float64 read gives, NaNs included.
func quiet(x uint32) uint32 {
	if x&0x7f800000 == 0x7f800000 && x&0x007fffff != 0 {
		return x | 0x00400000
	}
	return x
}

// F16ToF32 converts an IEEE half-precision value.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := int32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal
		v := float32(mant) / 1024 / 16384
		if sign != 0 {
			return -v
		}
		return v
	case exp == 31:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | mant<<13)
}

// DataOffset is where the data section starts: 8 plus the header's length.
func (f *File) DataOffset() int64 { return f.base }

// EncodeHeader returns the start of a safetensors file that declares tensors and metadata:
// the little-endian header length, then the JSON header padded with spaces to a multiple of
// 8 bytes (as Write pads it). The data section that follows must hold the tensors at their
// offsets.
func EncodeHeader(tensors map[string]Info, meta map[string]string) ([]byte, error) {
	hdr := make(map[string]any, len(tensors)+1)
	if len(meta) > 0 {
		hdr["__metadata__"] = meta
	}
	for k, v := range tensors {
		if k == "__metadata__" {
			return nil, errors.New("a tensor cannot be named __metadata__")
		}
		hdr[k] = v
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	out := make([]byte, 8, 8+len(hb))
	binary.LittleEndian.PutUint64(out, uint64(len(hb)))
	return append(out, hb...), nil
}

// Tensor is a float32 tensor to write.
type Tensor struct {
	Name  string
	Shape []int64
	Data  []float32
}

// Write writes float32 tensors (sorted by name) with metadata to path and returns the
// number of bytes written.
func Write(path string, tensors []Tensor, meta map[string]string) (int64, error) {
	sort.Slice(tensors, func(i, j int) bool { return tensors[i].Name < tensors[j].Name })
	hdr := map[string]any{}
	if len(meta) > 0 {
		hdr["__metadata__"] = meta
	}
	var off int64
	for _, t := range tensors {
		if Numel(t.Shape) != int64(len(t.Data)) {
			return 0, fmt.Errorf("tensor %q: shape %v does not match %d elements", t.Name, t.Shape, len(t.Data))
		}
		n := int64(len(t.Data)) * 4
		hdr[t.Name] = Info{DType: "F32", Shape: t.Shape, Offsets: [2]int64{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		return 0, err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 8, 8+len(hb))
	binary.LittleEndian.PutUint64(buf, uint64(len(hb)))
	buf = append(buf, hb...)
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return 0, err
	}
	for _, t := range tensors {
		b := make([]byte, 4*len(t.Data))
		for i, v := range t.Data {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return 0, err
		}
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return int64(len(buf)) + off, nil
}
