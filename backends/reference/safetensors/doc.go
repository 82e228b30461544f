// Package safetensors reads and writes the safetensors format (a little-endian u64 header
// length, a JSON header, then raw tensor bytes) and converts F32, F16, BF16 and F64
// tensors. Open and Parse validate a header against the file's size and the caller's
// Limits before anything it declares is allocated: known dtypes, shapes whose byte size
// fits an int64 and matches the data_offsets, and tensors that tile the data section
// exactly, as the specification requires.
package safetensors
