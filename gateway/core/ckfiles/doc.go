// Package ckfiles keeps the files of checkpoints in the checkpoint store (package ckstore:
// a local folder, by default DataDir/checkpoint-store, or an S3-compatible bucket): where
// each generation of a checkpoint lives, local folders to read it from, and what no record
// references any more.
//
// # Keys and generations
//
// A checkpoint's files live under the key <workspace>/<run>/<kind>/<name>@<generation>
// (Key), where the generation is the checkpoint's create_time in Unix nanoseconds
// (Generation; kept increasing by Files.NextGeneration), and a run's step snapshots under
// <workspace>/<run>/recovery/step-<seq>@<generation> (SnapshotKey). The store record (in
// the core's store) is the commit point: a save puts a new generation's key (its manifest
// written last, so the key is whole or absent), then replaces the record, then deletes the
// previous generation's key; a delete deletes the record, then the key. So a crash at any
// step leaves either the old or the new checkpoint, complete and listed. Changes to one
// checkpoint's record and keys are serialised by its lock (Files.Lock), one per checkpoint,
// so one workspace's slow save never waits on another's.
//
// Keys that no record references (a generation put but never recorded, one replaced or
// deleted by a process that died before deleting it) are removed by Files.Sweep once older
// than Config.SweepGrace, which also lets another gateway's save in progress be.
//
// # Reading
//
// Backends load adapters from folders: Files.Open gives the store's own folder for the
// local store (ckstore.LocalDirs, no copy), or a verified copy in the cache
// (DataDir/checkpoint-cache, ckstore.Cache, bounded by Config.CacheBytes) for S3, held while
// in use (Ref). A backend that takes presigned URLs (Files.UseURLs) reads and writes the
// store itself: Files.Adapter then gives a Ref with the generation's manifest, and
// Files.Source the URLs. Saves are written by the backend into DataDir/checkpoint-staging
// (Files.Staging), emptied at start-up, and put into the store from there.
//
// Data dirs written before the checkpoint store existed kept generation folders under
// DataDir/checkpoints; Files.Migrate moves the ones that records reference into the store at
// start-up and removes the rest.
//
// Errors that name the server's files have the data dir's absolute paths made relative
// (Files.Scrub) before a client may see them.
//
// # Locks
//
// The package's locks (the key locks' table, the generation counter, the sweep's, a Ref's)
// are leaves in the core's lock order (gateway/core/doc.go): nothing else is taken under
// them. A checkpoint's own lock (Files.Lock) is held across its record's store calls and its
// keys' changes, and is taken under no other lock.
package ckfiles
