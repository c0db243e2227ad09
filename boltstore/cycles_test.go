package boltstore

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// fillAndDrain (the data-file growth reproducer at the store) appends n rows of about payloadBytes (16 producers × 100-row
// batches, 4 task queues) while a claimer takes 256 visible rows per sweep
// and 64 deliverers complete them one by one and the pack pass runs every
// PackIntervalDefault, as a node with default flags does; it returns once
// every row is done and packed.
func fillAndDrain(t testing.TB, s *Store, b *testBundle, cycle, n, payloadBytes int) {
	t.Helper()
	pad := strings.Repeat("x", max(payloadBytes-40, 0))
	const producers, batch, deliverers = 16, 100, 64
	work := make(chan outbox.Row, 256)
	var wg, dwg sync.WaitGroup
	errs := make(chan error, producers+deliverers+1)
	for range deliverers {
		dwg.Go(func() {
			for r := range work {
				if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: s.now()}); err != nil {
					errs <- err
				}
			}
		})
	}
	// The pack pass, as RunTombstoneGC runs it (every PackInterval), and
	// once more when the cycle is over.
	stopPack := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() {
		tick := time.NewTicker(PackIntervalDefault)
		defer tick.Stop()
		for {
			select {
			case <-stopPack:
				return
			case <-tick.C:
				if _, err := s.PackTombstones(ctx); err != nil {
					errs <- err
				}
			}
		}
	})
	defer func() {
		close(stopPack)
		pwg.Wait()
		if _, err := packAll(ctx, s); err != nil {
			t.Fatal(err)
		}
	}()
	per := n / producers
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < per; i += batch {
				rows := make([]outbox.Row, 0, batch)
				for j := i; j < min(i+batch, per); j++ {
					k := fmt.Sprintf("load-c%d-%d", cycle, p*per+j)
					rows = append(rows, outbox.Row{DispatchKey: k, Namespace: fmt.Sprintf("c%d", cycle),
						TaskQueue: fmt.Sprintf("q%d", j%4), ContentType: "application/json",
						Payload: []byte(fmt.Sprintf(`{"t":%d,"pad":%q}`, 1769000000000000000+int64(j), pad))})
				}
				if _, err := s.Append(ctx, rows); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	claimed := 0
	for claimed < per*producers {
		rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: 256, Now: s.now()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			work <- r
		}
		claimed += len(rows)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	close(work)
	wg.Wait()
	dwg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// highWater is the bytes the file uses: bbolt's high-water page id × page
// size. The file itself grows in AllocSize steps (16 MiB), so its size
// moves in steps; this does not.
func highWater(t testing.TB, s *Store) int64 {
	t.Helper()
	var n int64
	must(t, s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil }))
	return n
}

// TestTombstonesGiveBackTheirPages fills and drains the store three times
// (20,000 rows of ~200-byte payloads each, appended by 16 producers while
// a claimer and 64 deliverers complete them and the pack pass runs every
// second, tombstone retention far longer than the test, the real clock)
// and asserts that every cycle after the first grows the file's
// high-water mark by at most 120 bytes per row (measured 26–73: the
// packed rows plus what a cycle's peak leaves in transit), and that a
// packed row costs at most 40 bytes of allocated pages (bundles and their
// expiry index; measured 29–30). Before finished rows were packed, a slim
// tombstone row and its two index entries grew it by 199–246 bytes a row
// and cycle; before they were slimmed, a done row kept its payload and
// its half-empty leaf: about 700. Done rows answer Get without their
// payload.
func TestTombstonesGiveBackTheirPages(t *testing.T) {
	volumeTest(t)
	t.Parallel()
	const rows, perRow, perPacked = 20_000, 120, 40
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 1024; o.Now = time.Now })
	var hw []int64
	for c := 1; c <= 3; c++ {
		fillAndDrain(t, s, b, c, rows, 200)
		hw = append(hw, highWater(t, s))
		t.Logf("cycle %d: high water %.1f MiB (%.2fx the first)", c, float64(hw[c-1])/(1<<20), float64(hw[c-1])/float64(hw[0]))
	}
	if got := logBucketBytes(t, s); got == 0 || got > perPacked {
		t.Errorf("a packed row costs %.1f bytes of allocated pages (want ≤ %d, and rows packed)", got, perPacked)
	}
	for c := 1; c < len(hw); c++ {
		if grew := hw[c] - hw[c-1]; grew > perRow*rows {
			t.Errorf("cycle %d grew the file's high water by %d bytes, %d per row (want ≤ %d): finished rows keep pages they no longer need",
				c+1, grew, grew/rows, perRow)
		}
	}
	st, err := s.NamespaceStats(ctx)
	must(t, err)
	for ns, v := range st {
		if v.Done != rows || v.Pending+v.Claimed != 0 {
			t.Fatalf("namespace %s: %+v, want %d done", ns, v, rows)
		}
	}
	if r := mustGet(t, s, "load-c2-123"); r.Status != outbox.StatusDone || r.Payload != nil || r.ContentType != "" {
		t.Fatalf("done row: %s, payload %d bytes, content type %q", r.Status, len(r.Payload), r.ContentType)
	}
}

// logBucketBytes logs, per bucket holding rows or their indexes, the
// bytes of pages it allocates and uses, and what the packed rows cost
// each (bundles and their expiry index over the packed rows); it returns
// the bytes allocated per packed row (0 if none).
func logBucketBytes(t testing.TB, s *Store) float64 {
	t.Helper()
	var packed int
	var perRow float64
	must(t, s.view(ctx, "stats", func(tx *bolt.Tx, b buckets) error {
		for _, name := range [][]byte{bucketRows, bucketByShard, bucketTombs, bucketBundles, bucketBExp} {
			st := tx.Bucket(name).Stats()
			t.Logf("%-8s %8d keys %9d bytes allocated %9d in use", name, st.KeyN, st.LeafAlloc+st.BranchAlloc, st.LeafInuse+st.BranchInuse)
		}
		c := b.bundles.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			br, err := openBundle(k, v)
			if err != nil {
				return err
			}
			packed += br.n
		}
		bs, es := b.bundles.Stats(), b.bexp.Stats()
		if packed > 0 {
			perRow = float64(bs.LeafAlloc+bs.BranchAlloc+es.LeafAlloc+es.BranchAlloc) / float64(packed)
			t.Logf("%d packed rows: %.1f bytes each allocated, %.1f in use", packed, perRow,
				float64(bs.LeafInuse+bs.BranchInuse+es.LeafInuse+es.BranchInuse)/float64(packed))
		}
		return nil
	}))
	return perRow
}

// BenchmarkFillAndDrainFileSize is the file-growth reproducer at the store:
// three cycles of 100,000 rows of ~200-byte payloads appended and fully
// delivered (tombstones kept: the default 24 h retention). One op = the
// three cycles; run it with -benchtime 1x. It reports the file size and the
// high-water mark after the first and the third cycle, in MiB. Under -short
// (make test runs every benchmark once, for its checks) a cycle is 10,000
// rows: 100,000 took ~50 s of the gate.
func BenchmarkFillAndDrainFileSize(b *testing.B) {
	rows := 100_000
	if testing.Short() {
		rows = 10_000
	}
	for range b.N {
		s, tb := newTestStore(b, func(o *Options) { o.ShardCount = 1024; o.Now = time.Now })
		var size, hw [3]float64
		for c := range 3 {
			fillAndDrain(b, s, tb, c+1, rows, 200)
			fi, err := os.Stat(tb.path)
			must(b, err)
			size[c], hw[c] = float64(fi.Size())/(1<<20), float64(highWater(b, s))/(1<<20)
			st := s.db.Stats()
			b.Logf("cycle %d: file %.1f MiB, high water %.1f MiB, free %.1f MiB (%d pages pending)", c+1, size[c], hw[c], float64(st.FreeAlloc)/(1<<20), st.PendingPageN)
		}
		b.ReportMetric(size[0], "file1-MiB")
		b.ReportMetric(size[2], "file3-MiB")
		b.ReportMetric(hw[0], "hw1-MiB")
		b.ReportMetric(hw[2], "hw3-MiB")
		b.ReportMetric(hw[2]/hw[0], "hw3/hw1")
		b.ReportMetric(size[2]/size[0], "file3/file1")
		logBucketBytes(b, s)
	}
}
