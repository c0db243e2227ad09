package boltstore

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

const envLockChild = "BOLTSTORE_TEST_LOCK_CHILD"

// lockChildMain holds the store at path open until stdin closes.
func lockChildMain(path string) int {
	s, err := Open(path, Options{ShardCount: testShardCount})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 2
	}
	fmt.Println("locked")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	if err := s.Close(); err != nil {
		return 3
	}
	return 0
}

func assertLocked(t *testing.T, path string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	s, err := Open(path, Options{ShardCount: testShardCount, LockTimeout: timeout})
	took := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("second open succeeded")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "data dir is in use by another process") {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	// It waits for the lock (bbolt polls every 50 ms and may give up one
	// poll early): a lower bound, which a slow machine only lengthens. It
	// does not wait forever: 30 s is a hang guard a hundred times the
	// timeout (two handles are opened, the read-only check and the
	// read-write one), not a measure of the machine.
	if took < timeout-100*time.Millisecond || took > 30*time.Second {
		t.Fatalf("second open took %s with LockTimeout %s", took, timeout)
	}
	t.Logf("second open gave up after %v with LockTimeout %v", took.Round(time.Millisecond), timeout)
}

func TestOpenLockedSameProcess(t *testing.T) {
	s, b := newTestStore(t)
	assertLocked(t, b.path, 300*time.Millisecond)
	mustAppend(t, s, row("still-works", "ns", "q"))
}

func TestOpenLockedOtherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envLockChild+"="+path)
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child: %q %v", line, err)
	}
	assertLocked(t, path, 300*time.Millisecond)
	must(t, stdin.Close())
	must(t, cmd.Wait())
	s, err := Open(path, Options{ShardCount: testShardCount})
	if err != nil {
		t.Fatalf("open after the other process exited: %v", err)
	}
	cleanupCheck(t, s)
}

// filledFile writes a store file with enough rows to span many pages.
func filledFile(t *testing.T) string {
	t.Helper()
	s, b := newTestStore(t)
	payload := []byte(strings.Repeat("x", 300))
	for batch := range 10 {
		rows := make([]outbox.Row, 200)
		for i := range rows {
			rows[i] = row(fmt.Sprintf("k-%d-%d", batch, i), fmt.Sprintf("ns%d", i%7), "q")
			rows[i].Payload = payload
		}
		mustAppend(t, s, rows...)
	}
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 500, Now: b.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	must(t, s.Check(ctx))
	must(t, s.Close())
	return b.path
}

func TestOpenCorruptFiles(t *testing.T) {
	pageSize := int64(os.Getpagesize())
	cases := []struct {
		name    string
		corrupt func(t *testing.T, path string)
	}{
		{"truncated to half", func(t *testing.T, path string) {
			fi, err := os.Stat(path)
			must(t, err)
			must(t, os.Truncate(path, fi.Size()/2))
		}},
		{"truncated to one page", func(t *testing.T, path string) { must(t, os.Truncate(path, pageSize)) }},
		{"truncated to 100 bytes", func(t *testing.T, path string) { must(t, os.Truncate(path, 100)) }},
		{"garbage over every data page", func(t *testing.T, path string) { scribble(t, path, 2*pageSize, 1) }},
		{"garbage over every third page", func(t *testing.T, path string) { scribble(t, path, 2*pageSize, 3) }},
		{"page bodies scribbled, headers intact", func(t *testing.T, path string) { scribbleBodies(t, path, 2, 16, 0) }},
		{"a few bytes of every page body", func(t *testing.T, path string) { scribbleBodies(t, path, 1, 40, 8) }},
		{"garbage over the meta pages", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			must(t, err)
			defer f.Close()
			buf := make([]byte, 2*pageSize)
			fillRandom(rand.New(rand.NewPCG(1, 2)), buf)
			_, err = f.WriteAt(buf, 0)
			must(t, err)
		}},
		{"not a bbolt file", func(t *testing.T, path string) {
			must(t, os.WriteFile(path, []byte(strings.Repeat("hello, not a database\n", 2000)), 0o600))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filledFile(t)
			tc.corrupt(t, path)
			s, err := Open(path, Options{ShardCount: testShardCount, LockTimeout: 200 * time.Millisecond})
			if err == nil {
				// Damage Open could not see (it only reads reachable pages)
				// must show in Check.
				err = s.Check(ctx)
				s.Close()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err %v, want ErrCorrupt", err)
			}
			t.Logf("reported: %v", err)
			// The lock was released: opening again fails the same way, not ErrLocked.
			if _, err := Open(path, Options{ShardCount: testShardCount, LockTimeout: 100 * time.Millisecond}); errors.Is(err, ErrLocked) {
				t.Fatalf("file left locked after a failed open: %v", err)
			}
		})
	}
}

// scribble overwrites every nth page from offset with random bytes.
func scribble(t *testing.T, path string, from int64, every int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	fi, err := f.Stat()
	must(t, err)
	ps := int64(os.Getpagesize())
	rng := rand.New(rand.NewPCG(7, uint64(every)))
	buf := make([]byte, ps)
	for off := from; off < fi.Size(); off += every * ps {
		fillRandom(rng, buf)
		_, err := f.WriteAt(buf, off)
		must(t, err)
	}
}

func TestOpenRejectsForeignBoltFileAndShardCountChange(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "other.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("users")); return err }))
	must(t, db.Close())
	if _, err := Open(foreign, Options{ShardCount: 4}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("foreign bbolt file: %v, want ErrCorrupt", err)
	}

	path := filepath.Join(dir, "outbox.db")
	s, err := Open(path, Options{ShardCount: 8})
	must(t, err)
	must(t, s.Close())
	if _, err := Open(path, Options{ShardCount: 16}); !errors.Is(err, ErrShardCountMismatch) {
		t.Fatalf("shard count change: %v, want ErrShardCountMismatch", err)
	}
	if _, err := Open(path, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("zero shard count: %v, want ErrInvalidOptions", err)
	}
	if _, err := Open(filepath.Join(dir, "missing-dir", "x.db"), Options{ShardCount: 8}); err == nil || errors.Is(err, ErrCorrupt) {
		t.Fatalf("unopenable path: %v, want a plain path error", err)
	}
}

func TestCheckFindsTampering(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(tx *bolt.Tx) error
		want   string
	}{
		{"pending entry deleted", func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketPending).Cursor().First()
			return tx.Bucket(bucketPending).Delete(append([]byte(nil), k...))
		}, "pending index entry missing"},
		{"stray claimed entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketClaimed).Put(timeIndexKey(time.Unix(5, 0), "ghost"), present)
		}, "claimed index has"},
		{"namespace counter off", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketNS).Put([]byte("ns"), counts{99, 0, 0, 0, 0}.encode())
		}, "namespace counter"},
		{"shard counter missing", func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketShards).Cursor().First()
			return tx.Bucket(bucketShards).Delete(append([]byte(nil), k...))
		}, "shard counter"},
		{"row records the wrong shard", func(tx *bolt.Tx) error {
			r, err := decodeRow(rowKey("a"), tx.Bucket(bucketRows).Get(rowKey("a")))
			if err != nil {
				return err
			}
			r.Shard++
			return tx.Bucket(bucketRows).Put(rowKey("a"), encodeRow(nil, &r))
		}, "records shard"},
		{"byshard entry missing", func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketByShard).Cursor().First()
			return tx.Bucket(bucketByShard).Delete(append([]byte(nil), k...))
		}, "byshard index entry missing"},
		{"digest sum off", func(tx *bolt.Tx) error {
			k, v := tx.Bucket(bucketDigests).Cursor().First()
			rows, sum, err := decodeDigest(v)
			if err != nil {
				return err
			}
			return tx.Bucket(bucketDigests).Put(append([]byte(nil), k...), digestVal(rows, sum+1))
		}, "digest of shard"},
		{"digest missing", func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketDigests).Cursor().First()
			return tx.Bucket(bucketDigests).Delete(append([]byte(nil), k...))
		}, "digest of shard"},
		{"row version changed behind the digest", func(tx *bolt.Tx) error {
			r, err := decodeRow(rowKey("a"), tx.Bucket(bucketRows).Get(rowKey("a")))
			if err != nil {
				return err
			}
			r.Version = r.Version.Next()
			return tx.Bucket(bucketRows).Put(rowKey("a"), encodeRow(nil, &r))
		}, "digest of shard"},
		{"undecodable row", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketRows).Put(rowKey("a"), []byte{1, 9})
		}, "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t)
			mustAppend(t, s, row("a", "ns", "q"), row("b", "ns", "q"))
			mustCheck(t, s)
			must(t, s.submit(context.Background(), "tamper", 1, func(w *wtx) error { return tc.tamper(w.tx) }))
			err := s.Check(ctx)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check: %v, want ErrCorrupt mentioning %q", err, tc.want)
			}
			// Leave a clean file for the cleanup check: Close without it.
			must(t, s.Close())
		})
	}
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// scribbleBodies overwrites, in every nth page from page 2, the bytes after
// the 16-byte page header (n bytes of them, or the rest of the page if n is
// 0), keeping the page header valid so bbolt's page-id check passes.
func scribbleBodies(t *testing.T, path string, every int64, from int64, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	fi, err := f.Stat()
	must(t, err)
	ps := int64(os.Getpagesize())
	n = cmp.Or(n, ps-from)
	rng := rand.New(rand.NewPCG(11, uint64(every)))
	buf := make([]byte, n)
	for off := 2 * ps; off < fi.Size(); off += every * ps {
		fillRandom(rng, buf)
		_, err := f.WriteAt(buf, off+from)
		must(t, err)
	}
}
