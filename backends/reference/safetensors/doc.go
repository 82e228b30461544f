// Package safetensors reads and writes the safetensors format (a little-endian u64 header
// length, a JSON header, then raw tensor bytes) for F32, F16, BF16 and F64 tensors.
package safetensors
