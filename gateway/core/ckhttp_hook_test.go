package core

import "net/http"

// ArchiveHandler serves a core's download links over HTTP for the tests of this package:
// the real handler, gateway/ckhttp's, which this package cannot import (ckhttp imports
// core). The external test package sets it (ckhttp_external_test.go) before any test runs.
var ArchiveHandler func(*Core) http.Handler

// archiveHandler is ArchiveHandler(c).
func archiveHandler(c *Core) http.Handler { return ArchiveHandler(c) }
