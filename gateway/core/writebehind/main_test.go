package writebehind

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test left a goroutine of the package running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
