package jobs

import (
	"os"
	"testing"
)

// TestMain lets the test binary be the relay inside the sandbox (as `loops jobs relay` is
// in the gateway).
func TestMain(m *testing.M) {
	if os.Getenv("LOOPS_TEST_RELAY") == "1" {
		os.Exit(RelayMain(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}
