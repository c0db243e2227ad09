//go:build !linux

package boltstore

// dropPageCache is a no-op outside Linux: the reopen reads through the
// page cache (see pagecache_linux.go).
func dropPageCache(string) {}
