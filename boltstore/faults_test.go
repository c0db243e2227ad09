package boltstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/boltstore/diskfault"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// faultStore opens a store at dir/outbox.db (a real file system the test
// can break) with a short first reopen interval, checked at cleanup.
func faultStore(t *testing.T, dir string, recover time.Duration) (*Store, *testBundle) {
	t.Helper()
	b := &testBundle{path: filepath.Join(dir, "outbox.db"), clock: newFakeClock(), reg: prometheus.NewPedanticRegistry()}
	b.opts = Options{ShardCount: testShardCount, Now: b.clock.Now, Registerer: b.reg, LockTimeout: time.Second, RecoverInterval: recover}
	s, err := Open(b.path, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	cleanupCheck(t, s)
	return s, b
}

// bigBatch is 16 rows of 4 KiB payloads (overflow pages: every batch
// needs fresh pages).
func bigBatch(prefix string, n int) []outbox.Row {
	rows := make([]outbox.Row, 16)
	for i := range rows {
		rows[i] = row(fmt.Sprintf("%s-%05d-%02d", prefix, n, i), "ns", "q")
		rows[i].Payload = []byte(strings.Repeat(fmt.Sprintf("%x", n%16), 4096))
	}
	return rows
}

// appendUntilFailure appends batches until one fails and returns the keys
// of the acknowledged ones, and the failed batch and its error.
func appendUntilFailure(t *testing.T, s *Store, prefix string) (acked []string, failed []outbox.Row, err error) {
	t.Helper()
	for n := range 20_000 {
		rows := bigBatch(prefix, n)
		if _, err := s.Append(ctx, rows); err != nil {
			return acked, rows, err
		}
		acked = append(acked, keysOfRows(rows)...)
	}
	t.Fatal("20,000 batches of 64 KiB appended to a full disk")
	return nil, nil, nil
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() != labels[i+1] {
						continue next
					}
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// assertRefusing: for a while, every write is refused with ErrNotWritable
// (without reaching a commit: the failure counter stays at one) and
// Writable says so, while reopen attempts fail.
func assertRefusing(t *testing.T, s *Store, b *testBundle, minFailedReopens float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		if err := s.Writable(); !errors.Is(err, ErrNotWritable) {
			t.Fatalf("Writable while the disk is broken: %v", err)
		}
		if _, err := s.Append(ctx, []outbox.Row{row(fmt.Sprintf("refused-%d", n), "ns", "q")}); !errors.Is(err, ErrNotWritable) {
			t.Fatalf("append while the disk is broken: %v, want ErrNotWritable", err)
		}
		if counterValue(t, b.reg, "fairshard_store_reopens_total", "result", "failed") >= minFailedReopens {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %v failed reopens in 10 s", minFailedReopens)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v := counterValue(t, b.reg, "fairshard_store_commit_failures_total"); v != 1 {
		t.Fatalf("%v commit failures, want 1: writes reached bbolt after the failure", v)
	}
	if v := counterValue(t, b.reg, "fairshard_store_writable"); v != 0 {
		t.Fatalf("fairshard_store_writable %v while refusing", v)
	}
}

// assertRecovered: once the disk works again, the store reopens, accepts
// writes, holds every acknowledged row and none of the failed batch.
func assertRecovered(t *testing.T, s *Store, b *testBundle, acked []string, failed []outbox.Row) {
	t.Helper()
	poll.Eventually(t, 40*time.Second, "the store to be writable again", func() (bool, string) { return s.Writable() == nil, "" })
	if v := counterValue(t, b.reg, "fairshard_store_reopens_total", "result", "ok"); v != 1 {
		t.Fatalf("writable again after %v successful reopens, want 1", v)
	}
	if out, err := s.Append(ctx, bigBatch("after", 0)); err != nil || out[0] != outbox.AppendCreated {
		t.Fatalf("append after recovery: %v %v", out, err)
	}
	for _, k := range acked {
		if r, err := s.Get(ctx, k); err != nil || r.Status != outbox.StatusPending {
			t.Fatalf("acknowledged row %q after recovery: %+v %v", k, r, err)
		}
	}
	for _, r := range failed {
		if _, err := s.Get(ctx, r.DispatchKey); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("row %q of the failed commit is there after the reopen: %v", r.DispatchKey, err)
		}
	}
	mustCheck(t, s)
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(`
# HELP fairshard_store_writable 1 while the store accepts writes, 0 after a failed commit until a reopen succeeds (the node is not ready meanwhile).
# TYPE fairshard_store_writable gauge
fairshard_store_writable 1
`), "fairshard_store_writable"); err != nil {
		t.Fatal(err)
	}
}

// TestDiskFullRefusesWritesUntilReopened: on a tmpfs that fills up, the
// append that cannot be written fails with ErrNotWritable (ENOSPC); the
// store then refuses every write and says it cannot write, reopen attempts
// fail while the disk is full, and once space is freed a reopen makes it
// writable again, with every acknowledged row.
func TestDiskFullRefusesWritesUntilReopened(t *testing.T) {
	dir := diskfault.Tmpfs(t, 24<<20)
	s, b := faultStore(t, dir, 50*time.Millisecond)
	var acked []string
	for n := range 10 {
		rows := bigBatch("before", n)
		mustAppend(t, s, rows...)
		acked = append(acked, keysOfRows(rows)...)
	}
	free := diskfault.Fill(t, dir)
	more, failed, err := appendUntilFailure(t, s, "full")
	acked = append(acked, more...)
	if !errors.Is(err, ErrNotWritable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v, want ErrNotWritable and ENOSPC", err)
	}
	t.Logf("%d rows acknowledged, then: %v", len(acked), err)
	assertRefusing(t, s, b, 2)
	free()
	assertRecovered(t, s, b, acked, failed)
}

// TestFsyncFailureStopsWrites: on an ext4 whose block device fails its
// writes (a loop device over a full tmpfs), write() still succeeds into the
// page cache but fsync fails. The commit that met the failed fsync fails
// with ErrNotWritable; the store writes nothing more (not one commit: the
// meta page's transaction id stays where it was) although the file system
// would take the writes; reopens fail while the device does; once it works
// again, one reopen re-reads the file from the disk (the failed commit's
// rows are not there) and writes go on.
func TestFsyncFailureStopsWrites(t *testing.T) {
	backing := diskfault.Tmpfs(t, 24<<20)
	dir := diskfault.ThinExt4(t, backing, 256<<20)
	// The first reopen comes late enough to check, first, that nothing is
	// written after the failure.
	s, b := faultStore(t, dir, 2*time.Second)
	var acked []string
	for n := range 10 {
		rows := bigBatch("before", n)
		mustAppend(t, s, rows...)
		acked = append(acked, keysOfRows(rows)...)
	}
	free := diskfault.Fill(t, backing)
	more, failed, err := appendUntilFailure(t, s, "thin")
	acked = append(acked, more...)
	if !errors.Is(err, ErrNotWritable) {
		t.Fatalf("append on a failing device: %v, want ErrNotWritable", err)
	}
	t.Logf("%d rows acknowledged, then: %v", len(acked), err)
	// The fault is at fsync: the file system still takes writes.
	probe := filepath.Join(dir, "probe")
	must(t, os.WriteFile(probe, make([]byte, 1<<20), 0o600))
	f, err := os.OpenFile(probe, os.O_RDWR, 0)
	must(t, err)
	if err := f.Sync(); err == nil {
		t.Fatal("harness: fsync on the full thin device succeeded")
	}
	_ = f.Close()
	must(t, os.Remove(probe))

	txid := fileTxid(t, b.path)
	for n := range 20 {
		if _, err := s.Append(ctx, []outbox.Row{row(fmt.Sprintf("after-fail-%d", n), "ns", "q")}); !errors.Is(err, ErrNotWritable) {
			t.Fatalf("append after the failed fsync: %v, want ErrNotWritable", err)
		}
	}
	if got := fileTxid(t, b.path); got != txid {
		t.Fatalf("the file's transaction id moved from %d to %d after the failed fsync", txid, got)
	}
	assertRefusing(t, s, b, 1)
	free()
	assertRecovered(t, s, b, acked, failed)
}

// fileTxid reads the highest transaction id of the file's two meta pages.
func fileTxid(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	var best uint64
	for _, off := range []int64{0, 4096} {
		buf := make([]byte, pageHeaderSize+metaLen)
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if m := parseMeta(buf); m.valid && m.txid > best {
			best = m.txid
		}
	}
	return best
}
