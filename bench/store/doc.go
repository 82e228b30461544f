// Package store holds the metadata store benchmark (issue 10, item 1): SQLite and
// PostgreSQL side by side in one run, calls per second and p50/p99 latency of creating a
// run, committing a batch of operations, and listing. Run with
//
//	go run ./bench/store/cmd/storebench
//
// Figures are recorded in README.md in this folder.
package store
