// Package diskfault gives tests real disk faults to run a store against:
// a small tmpfs that fills up (write returns ENOSPC), and an ext4 file
// system on a loop device whose backing file lives on such a tmpfs, so
// that once the tmpfs is full, write() into the page cache still succeeds
// but the writeback fails and fsync returns the error (the "fsyncgate"
// case: the kernel gives up pages the process believes are written). This
// is thin-provisioning exhaustion, a fault real storage shows, raised by
// the real kernel block layer; no call of the code under test is faked.
// Device-mapper's error and flakey targets would be the textbook tools,
// but the kernel these tests run on has no device-mapper
// (docs/adr/0072-test-tooling.md).
//
// Everything needs root and the mount, losetup and mkfs.ext4 commands
// (Debian packages mount and e2fsprogs; .ci/run installs them). Without
// them a test is skipped, or fails when FAIRSHARD_REQUIRE_FAULT_DEVICES=1
// (as CI sets it). Mounts and loop devices are removed at cleanup. Only
// tests import this package.
package diskfault

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// EnvRequire names the variable that turns a missing prerequisite from a
// skip into a failure.
const EnvRequire = "FAIRSHARD_REQUIRE_FAULT_DEVICES"

// Require skips (or, with EnvRequire=1, fails) t unless the process is
// root and has the given commands.
func Require(t testing.TB, commands ...string) {
	t.Helper()
	miss := func(format string, args ...any) {
		t.Helper()
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s=1 but "+format, append([]any{EnvRequire}, args...)...)
		}
		t.Skipf(format+" (set %s=1 to fail instead)", append(args, EnvRequire)...)
	}
	if os.Geteuid() != 0 {
		miss("disk fault tests need root")
	}
	for _, c := range append([]string{"mount", "umount"}, commands...) {
		if _, err := exec.LookPath(c); err != nil {
			miss("disk fault tests need %s: %v", c, err)
		}
	}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Tmpfs mounts a tmpfs of size bytes on a fresh directory and returns it;
// it is unmounted at cleanup.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "fairshard-test", dir)
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

func unmount(t testing.TB, dir string) {
	t.Helper()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		// Something still has a file open: detach it lazily so the next
		// test run is not left with a mount.
		if out2, err2 := exec.Command("umount", "-l", dir).CombinedOutput(); err2 != nil {
			t.Errorf("umount %s: %v: %s; umount -l: %v: %s", dir, err, out, err2, out2)
		}
	}
}

// Fill writes a file in dir until its file system is full (ENOSPC) and
// returns a function that deletes it again (giving the space back).
func Fill(t testing.TB, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "fill")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i) // not zeros: no file system may skip them
	}
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	for len(buf) > 1 && errors.Is(err, syscall.ENOSPC) {
		buf = buf[:len(buf)/2] // the last partial pages
		for {
			if _, err = f.Write(buf); err != nil {
				break
			}
		}
	}
	_ = f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("fill %s: %v, want ENOSPC", dir, err)
	}
	return func() {
		t.Helper()
		if err := os.Remove(path); err != nil {
			t.Fatalf("free %s: %v", dir, err)
		}
	}
}

// ThinExt4 makes an ext4 file system of size bytes on a loop device
// whose sparse backing file is in backingDir (a Tmpfs smaller than size),
// mounts it on a fresh directory and returns that directory. Once
// backingDir is full (Fill), writes into the ext4 page cache still
// succeed, but their writeback fails and fsync returns the error. The file
// system has no journal and its inode tables are written at creation, so
// only data blocks written later can fail. Unmounted and detached at
// cleanup.
func ThinExt4(t testing.TB, backingDir string, size int64) string {
	t.Helper()
	Require(t, "losetup", "mkfs.ext4")
	backing := filepath.Join(backingDir, "disk.img")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	dev := run(t, "losetup", "--find", "--show", backing)
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	run(t, "mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "lazy_itable_init=0,nodiscard", dev)
	dir := t.TempDir()
	run(t, "mount", "-o", "errors=continue", dev, dir)
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}
