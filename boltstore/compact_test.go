package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// drainedFile writes a store whose file once held 5,000 rows of 2 KiB
// payloads of which only 100 (pending) and 100 tombstones remain: most of
// its pages are free. It returns the path and what the remaining rows and
// digests are, the store closed.
func drainedFile(t *testing.T) (string, map[string]outbox.Row, []outbox.ShardDigest) {
	t.Helper()
	s, b := newTestStore(t, func(o *Options) { o.TombstoneRetention = time.Minute })
	payload := []byte(strings.Repeat("p", 2048))
	var rows []outbox.Row
	for i := range 5000 {
		r := row(fmt.Sprintf("k-%05d", i), "ns", "q")
		r.Payload = payload
		rows = append(rows, r)
	}
	mustAppend(t, s, rows...)
	complete := func(rows []outbox.Row) {
		var wg sync.WaitGroup
		work := make(chan outbox.Row)
		for range 64 {
			wg.Go(func() {
				for r := range work {
					must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: b.clock.Now()}))
				}
			})
		}
		for _, r := range rows {
			work <- r
		}
		close(work)
		wg.Wait()
	}
	claimed, err := s.Claim(ctx, outbox.ClaimParams{Limit: 4900, Now: b.clock.Now()})
	must(t, err)
	complete(claimed[:4800])
	b.clock.Advance(2 * time.Minute) // these 4,800 tombstones expire
	complete(claimed[4800:])
	if n, err := s.ExpireTombstones(ctx); err != nil || n != 4800 {
		t.Fatalf("expired %d tombstones: %v", n, err)
	}
	want := map[string]outbox.Row{}
	for _, r := range rows {
		if got, err := s.Get(ctx, r.DispatchKey); err == nil {
			want[r.DispatchKey] = got
		}
	}
	if len(want) != 200 {
		t.Fatalf("%d rows left, want 200", len(want))
	}
	digests, err := s.ShardDigests(ctx)
	must(t, err)
	mustCheck(t, s)
	must(t, s.Close())
	return b.path, want, digests
}

// TestCompactGivesSpaceBack: Compact shrinks a drained file to what its
// rows need, and the compacted file holds exactly the same rows, digests
// and indexes (it passes Check and serves claims).
func TestCompactGivesSpaceBack(t *testing.T) {
	path, want, digests := drainedFile(t)
	res, err := Compact(ctx, path, CompactOptions{})
	if err != nil {
		t.Fatalf("compact: %v", err)
	}
	fi, err := os.Stat(path)
	must(t, err)
	t.Logf("compacted %d → %d bytes (%d rows) in %s", res.Before, res.After, res.Rows, res.Took)
	if res.After != fi.Size() || res.Rows != 200 || res.After > res.Before/4 {
		t.Fatalf("result %+v (file %d bytes): want the file at most a quarter of its size, 200 rows", res, fi.Size())
	}
	if _, err := os.Stat(path + CompactSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the copy is still there: %v", err)
	}
	if _, err := os.Stat(path + ".orig"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an original was kept without KeepOriginal: %v", err)
	}
	s, err := Open(path, Options{ShardCount: testShardCount})
	must(t, err)
	cleanupCheck(t, s)
	for k, w := range want {
		if got := mustGet(t, s, k); outbox.Compare(got, w) != 0 || !got.CreatedAt.Equal(w.CreatedAt) {
			t.Fatalf("row %q after compaction: %+v, want %+v", k, got, w)
		}
	}
	got, err := s.ShardDigests(ctx)
	must(t, err)
	if fmt.Sprint(got) != fmt.Sprint(digests) {
		t.Fatalf("digests after compaction %v, want %v", got, digests)
	}
	// It still works as a store: the pending rows are claimable, appends
	// and tombstones dedupe.
	claimed, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1000, Now: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)})
	must(t, err)
	if len(claimed) != 100 {
		t.Fatalf("claimed %d pending rows after compaction, want 100", len(claimed))
	}
	if out := mustAppend(t, s, row("k-04950", "ns", "q"), row("new", "ns", "q")); out[0] != outbox.AppendDuplicate || out[1] != outbox.AppendCreated {
		t.Fatalf("append after compaction: %v", out)
	}
}

// TestCompactKeepOriginal keeps the original beside the compacted file.
func TestCompactKeepOriginal(t *testing.T) {
	path, _, _ := drainedFile(t)
	before, err := os.ReadFile(path)
	must(t, err)
	if _, err := Compact(ctx, path, CompactOptions{KeepOriginal: true}); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(path + ".orig")
	must(t, err)
	if string(orig) != string(before) {
		t.Fatal("the kept original differs from the file before compaction")
	}
}

// TestCompactRefusesALockedFile: a file open in a store (a running node)
// is refused with ErrLocked, and nothing is written.
func TestCompactRefusesALockedFile(t *testing.T) {
	path, _, _ := drainedFile(t)
	s, err := Open(path, Options{ShardCount: testShardCount})
	must(t, err)
	defer s.Close()
	before, err := os.ReadFile(path)
	must(t, err)
	_, err = Compact(ctx, path, CompactOptions{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("compact of a locked file: %v, want ErrLocked", err)
	}
	after, err := os.ReadFile(path)
	must(t, err)
	if string(after) != string(before) {
		t.Fatal("the locked file changed")
	}
	if _, err := os.Stat(path + CompactSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a copy was written: %v", err)
	}
}

// TestCompactRefusesBadFiles: a missing, empty, foreign or corrupt file is
// refused and left as it was; a stale copy of an interrupted compaction is
// replaced.
func TestCompactRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Compact(ctx, filepath.Join(dir, "missing.db"), CompactOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	empty := filepath.Join(dir, "empty.db")
	must(t, os.WriteFile(empty, nil, 0o600))
	if _, err := Compact(ctx, empty, CompactOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("empty file: %v", err)
	}
	garbage := filepath.Join(dir, "garbage.db")
	must(t, os.WriteFile(garbage, []byte(strings.Repeat("garbage!", 4096)), 0o600))
	if _, err := Compact(ctx, garbage, CompactOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage file: %v", err)
	}
	// A bbolt file that is not a store file.
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err }))
	must(t, db.Close())
	if _, err := Compact(ctx, foreign, CompactOptions{}); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not a boltstore file") {
		t.Fatalf("foreign bbolt file: %v", err)
	}
	if _, err := os.Stat(foreign + CompactSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a copy of a foreign file was left: %v", err)
	}
	// A stale copy left by an interrupted compaction is replaced.
	path, want, _ := drainedFile(t)
	must(t, os.WriteFile(path+CompactSuffix, []byte("half a copy"), 0o600))
	if res, err := Compact(ctx, path, CompactOptions{}); err != nil || res.Rows != int64(len(want)) {
		t.Fatalf("compact over a stale copy: %+v %v", res, err)
	}
}

// TestCompactVerifierFindsDifferences: the copy check compares every
// bucket, key and value of the two files.
func TestCompactVerifierFindsDifferences(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, fill func(tx *bolt.Tx) error) string {
		p := filepath.Join(dir, name)
		db, err := bolt.Open(p, 0o600, nil)
		must(t, err)
		must(t, db.Update(fill))
		must(t, db.Close())
		return p
	}
	base := func(tx *bolt.Tx) error {
		for _, name := range []string{"a", "rows"} {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for i := range 50 {
				if err := b.Put(fmt.Appendf(nil, "k%02d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	srcPath := mk("src.db", base)
	src, err := bolt.Open(srcPath, 0o600, &bolt.Options{ReadOnly: true})
	must(t, err)
	defer src.Close()
	opts := Options{}.withDefaults()
	same := mk("same.db", base)
	if n, err := sameContent(src, same, opts); err != nil || n != 50 {
		t.Fatalf("identical files: %d rows, %v", n, err)
	}
	for name, change := range map[string]func(tx *bolt.Tx) error{
		"changed value":  func(tx *bolt.Tx) error { return tx.Bucket([]byte("rows")).Put([]byte("k07"), []byte("other")) },
		"missing key":    func(tx *bolt.Tx) error { return tx.Bucket([]byte("a")).Delete([]byte("k49")) },
		"extra key":      func(tx *bolt.Tx) error { return tx.Bucket([]byte("a")).Put([]byte("k99"), []byte("x")) },
		"extra bucket":   func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("z")); return err },
		"missing bucket": func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("a")) },
	} {
		p := mk(strings.ReplaceAll(name, " ", "-")+".db", func(tx *bolt.Tx) error {
			if err := base(tx); err != nil {
				return err
			}
			return change(tx)
		})
		if _, err := sameContent(src, p, opts); err == nil {
			t.Errorf("%s: the verifier saw no difference", name)
		}
	}
}

// TestOpenAfterTheFileWasReplaced: an Open waiting for the lock of a file
// that Compact then replaces (renamed its copy over the path) opens the
// new file, not the unlinked one it was waiting on.
func TestOpenAfterTheFileWasReplaced(t *testing.T) {
	s, b := newTestStore(t)
	mustAppend(t, s, row("old-only", "ns", "q"))
	// The replacement, with a row only it has.
	next := b.path + ".next"
	s2, err := Open(next, Options{ShardCount: testShardCount})
	must(t, err)
	mustAppend(t, s2, row("new-only", "ns", "q"))
	must(t, s2.Close())

	type result struct {
		s   *Store
		err error
	}
	done := make(chan result, 1)
	open := fdsOn(t, b.path)
	go func() {
		s, err := Open(b.path, Options{ShardCount: testShardCount, LockTimeout: 10 * time.Second, SkipOpenCheck: true})
		done <- result{s, err}
	}()
	// Wait until the Open holds the old file open (it then waits for the
	// lock, or holds the lock of a file no longer at the path).
	poll.Eventually(t, 5*time.Second, "another descriptor open on the data file", func() (bool, string) { return fdsOn(t, b.path) > open, "" })
	must(t, os.Rename(next, b.path))
	must(t, s.Close())
	r := <-done
	if r.err != nil {
		t.Fatalf("open after the replacement: %v", r.err)
	}
	cleanupCheck(t, r.s)
	if _, err := r.s.Get(context.Background(), "new-only"); err != nil {
		t.Fatalf("the waiting Open did not open the new file: %v", err)
	}
	if _, err := r.s.Get(context.Background(), "old-only"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("the waiting Open sees the replaced file: %v", err)
	}
}

// fdsOn counts this process's open descriptors on path (Linux /proc).
func fdsOn(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == path {
			n++
		}
	}
	return n
}
