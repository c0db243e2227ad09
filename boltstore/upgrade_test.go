package boltstore

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// copyFixture copies testdata/name into a temp dir and returns its path.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	must(t, err)
	path := filepath.Join(t.TempDir(), "outbox.db")
	must(t, os.WriteFile(path, b, 0o600))
	return path
}

// TestOpenUpgradesFormat1: a data file written by the build before row
// versions (testdata/format1.db, made by testdata/mkfixture-format1.go.txt
// on main at 72d7033: 40 rows over 16 shards, pending, claimed, done,
// failed and retried ones, two of shard 5 left marked in-transfer, a config
// entry) opens: the file becomes format 3, every shard gets its digest,
// rows read back with the zero Version, marks are cleared, and the store
// works on them (settles fenced by the zero version, merges, checks).
func TestOpenUpgradesFormat1(t *testing.T) {
	path := copyFixture(t, "format1.db")
	b := &testBundle{path: path, clock: newFakeClock()}
	b.opts = Options{ShardCount: 16, Now: b.clock.Now, LockTimeout: 200 * time.Millisecond}
	s, err := Open(path, b.opts)
	if err != nil {
		t.Fatalf("open a format 1 file: %v", err)
	}
	cleanupCheck(t, s)
	mustCheck(t, s) // digests computed by the upgrade agree with the rows
	byStatus := map[outbox.Status]int{}
	var claimed []outbox.Row
	for i := range 40 {
		k := "key-" + twoDigits(i)
		r := mustGet(t, s, k)
		if !r.Version.IsZero() {
			t.Fatalf("format 1 row %q decoded with version %v, want zero", k, r.Version)
		}
		if r.Shard != shards.ShardOf(k, 16) || string(r.Payload) == "" || r.Namespace != "ns" {
			t.Fatalf("format 1 row %q read back as %+v", k, r)
		}
		byStatus[r.Status]++
		if r.Status == outbox.StatusClaimed {
			claimed = append(claimed, r)
		}
	}
	if byStatus[outbox.StatusDone] != 3 || byStatus[outbox.StatusFailed] != 3 || len(claimed) != 3 || byStatus[outbox.StatusPending] != 31 {
		t.Fatalf("statuses after the upgrade: %v", byStatus)
	}
	if n, err := s.MarkedRows(ctx); err != nil || n != 0 {
		t.Fatalf("marks left by the format 1 handoff: %d %v, want cleared", n, err)
	}
	if cfg, err := s.LoadConfigEntries(ctx); err != nil || string(cfg["quota/ns"]) != "8" {
		t.Fatalf("config entries: %v %v", cfg, err)
	}
	ds, err := s.ShardDigests(ctx)
	must(t, err)
	total := int64(0)
	for _, d := range ds {
		total += d.Rows
	}
	if total != 40 {
		t.Fatalf("digests count %d rows, want 40", total)
	}
	// A claim from before the upgrade settles with its (zero) version and
	// the row is rewritten in format 2.
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: claimed[0].DispatchKey, Claim: claimed[0].Version, Now: b.clock.Now()}))
	if r := mustGet(t, s, claimed[0].DispatchKey); r.Status != outbox.StatusDone || r.Version != (outbox.Version{Seq: 1}) {
		t.Fatalf("settled legacy claim: %s %v", r.Status, r.Version)
	}
	// An incoming versioned copy beats a legacy live row; a legacy
	// terminal row still beats a live copy.
	live := mustGet(t, s, "key-39")
	live.Version, live.Attempt = outbox.FirstVersion, 2
	res, err := s.Merge(ctx, []outbox.Row{live})
	if err != nil || res.Updated != 1 {
		t.Fatalf("versioned copy over a legacy row: %+v %v", res, err)
	}
	s = reopen(t, s, b)
	mustCheck(t, s)
	var format uint64
	must(t, s.db.View(func(tx *bolt.Tx) error {
		format, _ = binary.Uvarint(tx.Bucket(bucketMeta).Get(metaFormat))
		return nil
	}))
	if format != formatVersion {
		t.Fatalf("meta format %d after the upgrade, want %d", format, formatVersion)
	}
}

// TestOpenUpgradesFormat2: a data file written by the build before
// bundles (testdata/format2.db, made by testdata/mkfixture-format2.go.txt
// on replint at e523262: 70 rows over 16 shards and 3 namespaces, slim
// done rows with and without retries, a redriven-then-done row,
// cancelled rows with and without a reason, dead letters, live rows,
// rows of shard 5 left marked in-transfer, a config entry) opens: the
// file becomes format 3 with its bundle buckets, marks are cleared, and
// the pack pass then packs every done and cancelled row without changing
// anything any call reads: Get (every field), digests, namespace stats,
// dedupe. The packed file checks, and reopens.
func TestOpenUpgradesFormat2(t *testing.T) {
	path := copyFixture(t, "format2.db")
	b := &testBundle{path: path, clock: newFakeClock()}
	b.clock.Set(time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC))
	b.opts = Options{ShardCount: 16, Now: b.clock.Now, LockTimeout: 200 * time.Millisecond}
	s, err := Open(path, b.opts)
	if err != nil {
		t.Fatalf("open a format 2 file: %v", err)
	}
	cleanupCheck(t, s)
	mustCheck(t, s)
	var format uint64
	must(t, s.db.View(func(tx *bolt.Tx) error {
		format, _ = binary.Uvarint(tx.Bucket(bucketMeta).Get(metaFormat))
		return nil
	}))
	if format != formatVersion {
		t.Fatalf("meta format %d after the upgrade, want %d", format, formatVersion)
	}
	if n, err := s.MarkedRows(ctx); err != nil || n != 0 {
		t.Fatalf("marks left by the format 2 handoff: %d %v, want cleared", n, err)
	}
	page, err := s.ListRows(ctx, outbox.RowQuery{Limit: 1000})
	must(t, err)
	if len(page.Rows) != 70 {
		t.Fatalf("format 2 file lists %d rows, want 70", len(page.Rows))
	}
	before := map[string]outbox.Row{}
	finished := 0
	kinds := map[string]int{}
	for _, r := range page.Rows {
		before[r.DispatchKey] = r
		if r.Status == outbox.StatusDone || r.Status == outbox.StatusCancelled {
			finished++
			switch {
			case r.Version.Gen > 0:
				kinds["redriven"]++
			case r.LastError != "" && r.Status == outbox.StatusDone:
				kinds["retried"]++
			case r.LastError != "":
				kinds["reason"]++
			}
			if _, _, ok := keyWorkflow(r.DispatchKey); !ok {
				kinds["own key"]++
			}
		}
	}
	if finished < 20 || kinds["redriven"] == 0 || kinds["retried"] == 0 || kinds["reason"] == 0 || kinds["own key"] == 0 {
		t.Fatalf("fixture: %d finished rows, kinds %v: not what it should hold", finished, kinds)
	}
	digests, err := s.ShardDigests(ctx)
	must(t, err)
	stats, err := s.NamespaceStats(ctx)
	must(t, err)
	n, err := s.PackTombstones(ctx)
	must(t, err)
	if n != finished {
		t.Fatalf("packed %d rows, want the %d done and cancelled ones", n, finished)
	}
	mustCheck(t, s)
	assertSameRows(t, s, before)
	assertSameDigests(t, s, digests)
	if st, err := s.NamespaceStats(ctx); err != nil || !reflect.DeepEqual(st, stats) {
		t.Fatalf("namespace stats after packing: %+v %v, want %+v", st, err, stats)
	}
	var again []outbox.Row
	for k := range before {
		again = append(again, row(k, "ns", "q"))
	}
	for i, o := range mustAppend(t, s, again...) {
		if o != outbox.AppendDuplicate {
			t.Fatalf("append of the stored key %q: %s", again[i].DispatchKey, o)
		}
	}
	s = reopen(t, s, b)
	mustCheck(t, s)
	assertSameRows(t, s, before)
}

// assertSameRows fails unless s holds exactly want (every field).
func assertSameRows(t *testing.T, s *Store, want map[string]outbox.Row) {
	t.Helper()
	for k, w := range want {
		got := mustGet(t, s, k)
		if !sameRow(&got, &w) {
			t.Fatalf("row %q reads back as\n%+v\nwant\n%+v", k, got, w)
		}
	}
	page, err := s.ListRows(ctx, outbox.RowQuery{Limit: len(want) + 1})
	must(t, err)
	if len(page.Rows) != len(want) || page.Next != "" {
		t.Fatalf("ListRows: %d rows (next %q), want %d", len(page.Rows), page.Next, len(want))
	}
	for i := range page.Rows {
		w := want[page.Rows[i].DispatchKey]
		if !sameRow(&page.Rows[i], &w) || (i > 0 && page.Rows[i-1].DispatchKey >= page.Rows[i].DispatchKey) {
			t.Fatalf("ListRows row %d: %+v, want %+v in key order", i, page.Rows[i], w)
		}
	}
}

// assertSameDigests fails unless s's shard digests are want.
func assertSameDigests(t *testing.T, s *Store, want []outbox.ShardDigest) {
	t.Helper()
	got, err := s.ShardDigests(ctx)
	must(t, err)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("digests %v, want %v", got, want)
	}
}

func twoDigits(i int) string { return string([]byte{'0' + byte(i/10), '0' + byte(i%10)}) }

// TestOpenRefusesNewerFormat: a file of a format this build does not know
// fails with ErrCorrupt naming the formats, and is left untouched.
func TestOpenRefusesNewerFormat(t *testing.T) {
	s, b := newTestStore(t)
	mustAppend(t, s, row("a", "ns", "q"))
	must(t, s.Close())
	db, err := bolt.Open(b.path, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaFormat, binary.AppendUvarint(nil, formatVersion+1))
	}))
	must(t, db.Close())
	_, err = Open(b.path, b.opts)
	if !errors.Is(err, ErrCorrupt) || !containsAll(err.Error(), "format version 4", "reads 1 to 3") {
		t.Fatalf("open a format 4 file: %v", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
