package ckstore_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/loops-dev/loops/gateway/ckstore/ckstoretest"
)

func TestMain(m *testing.M) {
	ckstoretest.HelperMain()
	os.Exit(m.Run())
}

func TestLocalContract(t *testing.T) {
	ckstoretest.Run(t, func(t *testing.T) string { return filepath.Join(t.TempDir(), "checkpoints") })
}
