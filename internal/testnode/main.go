package testnode

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main is a TestMain for packages that start nodes: it runs the tests,
// then each of after (closing what the tests share: idle connections of
// a package-wide HTTP client, nodes of examples), then, when every test
// passed, fails the run on any goroutine still running (every node,
// memberlist, HTTP server and peer client must be gone after Close), and
// exits.
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
