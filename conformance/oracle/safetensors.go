package oracle

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// Tensor is a dense row-major float64 array.
type Tensor struct {
	Shape []int
	Data  []float64
}

// Clone returns a deep copy of the tensor.
func (t *Tensor) Clone() *Tensor {
	return &Tensor{Shape: append([]int(nil), t.Shape...), Data: append([]float64(nil), t.Data...)}
}

// Rows is the first dimension.
func (t *Tensor) Rows() int { return t.Shape[0] }

// Cols is the product of all but the first dimension (1 for a 1-D tensor).
func (t *Tensor) Cols() int {
	c := 1
	for _, d := range t.Shape[1:] {
		c *= d
	}
	return c
}

type stEntry struct {
	Dtype   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// ReadSafetensors reads every tensor of a .safetensors file as float64. It understands F64,
// F32, F16 and BF16 (integer tensors are an error). It also returns the file's
// __metadata__ strings.
func ReadSafetensors(path string) (map[string]*Tensor, map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if len(raw) < 8 {
		return nil, nil, fmt.Errorf("%s: too short for a safetensors file", path)
	}
	n := binary.LittleEndian.Uint64(raw[:8])
	if n > uint64(len(raw)-8) {
		return nil, nil, fmt.Errorf("%s: header length %d exceeds the file", path, n)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		return nil, nil, fmt.Errorf("%s: bad header: %w", path, err)
	}
	body := raw[8+n:]
	meta := map[string]string{}
	out := map[string]*Tensor{}
	names := make([]string, 0, len(hdr))
	for k := range hdr {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "__metadata__" {
			if err := json.Unmarshal(hdr[name], &meta); err != nil {
				return nil, nil, fmt.Errorf("%s: bad __metadata__: %w", path, err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(hdr[name], &e); err != nil {
			return nil, nil, fmt.Errorf("%s: tensor %s: %w", path, name, err)
		}
		count := 1
		for _, d := range e.Shape {
			count *= d
		}
		lo, hi := e.Offsets[0], e.Offsets[1]
		if lo < 0 || hi < lo || hi > int64(len(body)) {
			return nil, nil, fmt.Errorf("%s: tensor %s: offsets %v out of range", path, name, e.Offsets)
		}
		b := body[lo:hi]
		var size int
		switch e.Dtype {
		case "F64":
			size = 8
		case "F32":
			size = 4
		case "F16", "BF16":
			size = 2
		default:
			return nil, nil, fmt.Errorf("%s: tensor %s has dtype %s; want F64, F32, F16 or BF16", path, name, e.Dtype)
		}
		if len(b) != count*size {
			return nil, nil, fmt.Errorf("%s: tensor %s: %d bytes for %d elements of %s", path, name, len(b), count, e.Dtype)
		}
		data := make([]float64, count)
		for i := range data {
			switch e.Dtype {
			case "F64":
				data[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			case "F32":
				data[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
			case "BF16":
				data[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
			case "F16":
				data[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
			}
		}
		shape := append([]int(nil), e.Shape...)
		if len(shape) == 0 {
			shape = []int{1}
		}
		out[name] = &Tensor{Shape: shape, Data: data}
	}
	return out, meta, nil
}

// halfToFloat decodes an IEEE 754 binary16 value.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 0x1f:
		if frac == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}
