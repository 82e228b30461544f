// Package ckstore holds the checkpoint store benchmark (issue 10): checkpoint save and
// load times through the core, on the local folder and on S3 (a real S3-compatible
// server, SeaweedFS's weed) side by side in one run, for a loops/tiny adapter and a
// Qwen3-0.6B-shaped rank-32 training checkpoint. Run with
//
//	LOOPS_BENCH=1 go test -count=1 -v -run CheckpointStore ./bench/ckstore/
//
// Figures are recorded in README.md in this folder.
package ckstore
