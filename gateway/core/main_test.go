package core

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/loops-dev/loops/gateway/ckstore/s3test"
)

// TestMain shares one S3-compatible server (weed) among the package's S3 tests, each in a
// bucket of its own, instead of starting one per test, and then checks that no test left a
// goroutine running: every goroutine a Core starts belongs to its lifecycle owner, so
// Close ends them all.
func TestMain(m *testing.M) {
	code := s3test.Main(m)
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			os.Stderr.WriteString("goleak: goroutines left running after the tests:\n" + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions are the goroutines that outlive a Core by design: process-wide pools of the
// libraries it uses, not the core's own.
func leakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"),
	}
}
