package core

import (
	"os"
	"testing"

	"github.com/loops-dev/loops/gateway/ckstore/s3test"
)

// TestMain shares one S3-compatible server (weed) among the package's S3 tests, each in a
// bucket of its own, instead of starting one per test.
func TestMain(m *testing.M) { os.Exit(s3test.Main(m)) }
