// Package ckhttp serves the checkpoint transfers that are plain HTTP streams rather than
// loops.v1 calls: download links (ArchivePrefix: a tar of a checkpoint, or one of its
// files, for a short-lived token the core issued), exports (ExportPath: a checkpoint's
// adapter folder, or its base model with the adapter merged in, as a tar) and imports
// (ImportPath: a tar of a PEFT adapter folder trained elsewhere becomes a checkpoint).
//
// The handlers talk to the core through Checkpoints, a small interface of what they need
// (a link's files, a checkpoint's folder, a merge, an import into a workspace), which
// *core.Core implements; the core keeps the decisions (who may read what, what an import
// must hold), this package the wire: tar streams, statuses, and the bounds of a transfer.
//
// Bounds. A merged export holds the merged weights on disk while it streams and an import
// holds a slot while its body arrives, so both are counted: at most Options.MaxExports and
// Options.MaxImports run at once on the server, and at most MaxExportsPerWorkspace and
// MaxImportsPerWorkspace of them for one workspace, so no workspace can hold every slot
// (429 with Retry-After past either). Every transfer, downloads included, must keep a
// minimum rate: one that moves fewer than MinRate bytes a second over RateWindow is cut (an
// import with a 408 that says so; a download is cut short, so the client sees a failed
// download), which frees what it held. An import is not bound by the server's body read
// timeout but by its own: ImportTimeout from its first byte to its answer, the minimum rate
// all along; its body is read up to MaxImportBytes.
package ckhttp
