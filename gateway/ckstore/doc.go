// Package ckstore stores checkpoint folders as objects: in a local folder (the default) or
// in an S3-compatible bucket (Open("s3://bucket/prefix")).
//
// A checkpoint is a folder of regular files (a PEFT adapter folder, plus optimizer state
// for training checkpoints) stored under a key, a slash-separated path such as
// "<workspace>/<run>/weights/<name>". Put uploads the files as parts under
// <key>/@parts/<generation>/ (a fresh random generation on every Put) and then commits the
// checkpoint by writing <key>/@manifest.json last: the file names, sizes and SHA-256
// hashes, and the generation. A checkpoint exists, for List, Stat, Fetch, Open and URL,
// only once its manifest does, and a manifest is written in one atomic step (a single S3
// PUT; a rename in the local folder), so a save killed at any point lists and loads
// nothing, and an overwrite killed before its manifest leaves the previous checkpoint
// whole. After the commit, Put removes the previous generation's parts; Delete removes the
// manifest first, then the parts. Parts that no manifest references (a killed save, a
// crash between the commit and the removal) are garbage that Sweep removes.
//
// Fetch copies a committed checkpoint into a local folder, checking every file's size and
// hash, through a temporary sibling folder renamed into place only when complete. Nothing
// read from the store is trusted for an allocation: a manifest is read through a
// MaxManifestBytes cap, its file count is capped by MaxFiles, and a checkpoint larger than
// Limits.MaxCheckpointBytes is refused before anything is downloaded; file contents are
// streamed to disk, never held in memory.
//
// Writers of one key are expected to be serialised by the caller (the gateway owning the
// run); readers need no coordination with writers: a Fetch that races an overwrite and
// finds its generation's parts gone re-reads the manifest and starts again.
//
// The S3 store also implements Uploads: a process without the store's credentials (a
// worker on another host) writes a checkpoint's files through presigned PUT URLs and the
// key's owner commits them, and reads them through presigned GET URLs. The local store can
// hard-link Put's files instead of copying them (Options.LinkFiles).
//
// Every implementation passes the contract suite in package ckstoretest; the S3 one runs
// it against a real S3-compatible server started by package s3test.
package ckstore
