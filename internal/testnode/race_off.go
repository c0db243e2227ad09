//go:build !race

package testnode

// Race reports whether this test binary was built with -race: then Build's
// node binaries for its scenarios are race-built too.
const Race = false
