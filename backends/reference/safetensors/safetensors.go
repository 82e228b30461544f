package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Info describes one tensor in a file.
type Info struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// File is an open safetensors file.
type File struct {
	f        *os.File
	base     int64
	Tensors  map[string]Info
	Metadata map[string]string
}

// Open reads the header of a safetensors file.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: reading header length: %w", path, err)
	}
	if n > 100<<20 {
		f.Close()
		return nil, fmt.Errorf("%s: header of %d bytes is too large", path, n)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: reading header: %w", path, err)
	}
	raw := map[string]json.RawMessage{}
	if err := json.Unmarshal(hdr, &raw); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: bad header: %w", path, err)
	}
	out := &File{f: f, base: 8 + int64(n), Tensors: map[string]Info{}, Metadata: map[string]string{}}
	for k, v := range raw {
		if k == "__metadata__" {
			_ = json.Unmarshal(v, &out.Metadata)
			continue
		}
		var info Info
		if err := json.Unmarshal(v, &info); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: tensor %q: %w", path, k, err)
		}
		out.Tensors[k] = info
	}
	return out, nil
}

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }

// Numel returns the number of elements of a shape.
func Numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func elemSize(dtype string) (int, error) {
	switch dtype {
	case "F32":
		return 4, nil
	case "F16", "BF16":
		return 2, nil
	case "F64":
		return 8, nil
	}
	return 0, fmt.Errorf("unsupported dtype %s (want F32, F16, BF16 or F64)", dtype)
}

// ReadFloat64 reads a tensor converted to float64.
func (f *File) ReadFloat64(name string) ([]float64, []int64, error) {
	info, ok := f.Tensors[name]
	if !ok {
		return nil, nil, fmt.Errorf("tensor %q not found", name)
	}
	es, err := elemSize(info.DType)
	if err != nil {
		return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	n := Numel(info.Shape)
	if info.Offsets[1]-info.Offsets[0] != n*int64(es) {
		return nil, nil, fmt.Errorf("tensor %q: byte length does not match shape", name)
	}
	buf := make([]byte, n*int64(es))
	if _, err := f.f.ReadAt(buf, f.base+info.Offsets[0]); err != nil {
		return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	out := make([]float64, n)
	switch info.DType {
	case "F32":
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:])))
		}
	case "F64":
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(buf[8*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(buf[2*i:])) << 16))
		}
	case "F16":
		for i := range out {
			out[i] = float64(F16ToF32(binary.LittleEndian.Uint16(buf[2*i:])))
		}
	}
	return out, info.Shape, nil
}

// ReadFloat32 reads a tensor converted to float32.
func (f *File) ReadFloat32(name string) ([]float32, []int64, error) {
	d, s, err := f.ReadFloat64(name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, len(d))
	for i, v := range d {
		out[i] = float32(v)
	}
	return out, s, nil
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
