//go:build !unix

package compose

import "os"

// Without flock the runs are not serialised (the test targets Linux hosts).
func tryLock(*os.File) bool   { return true }
func waitLock(*os.File) error { return nil }
func unlockFile(*os.File)     {}
