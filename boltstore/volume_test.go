package boltstore

import (
	"os"
	"testing"
)

// volumeTest marks a test that writes hundreds of thousands of rows to
// measure the file's growth: a layout property, which the race detector
// slows tenfold without covering more (the smaller store tests exercise
// the same code paths under -race). Under -race it runs only with
// FAIRSHARD_LONG=1 (make test-long); the gate runs it in its own step
// without -race: list it in the Makefile's VOLUME. -short skips it.
func volumeTest(t *testing.T) {
	t.Helper()
	switch {
	case testing.Short():
		t.Skip("a volume test: skipped under -short")
	case raceEnabled && os.Getenv("FAIRSHARD_LONG") != "1":
		t.Skip("a volume test: the gate runs it without -race (make test); FAIRSHARD_LONG=1 runs it here")
	}
}
