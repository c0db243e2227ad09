package boltstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropPageCache asks the kernel to forget the cached pages of the file at
// path (posix_fadvise DONTNEED), so that the next reads come from the
// disk. After a failed fsync the kernel may keep pages it never wrote,
// marked clean: a reopen that read them would see data the disk does not
// hold. Errors are ignored: the reopen goes on through the cache.
func dropPageCache(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
