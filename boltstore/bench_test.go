package boltstore

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Benchmarks for docs/BENCHMARKS.md ("boltstore: durable outbox"). Each
// boltstore figure has a naive baseline beside it, run in the same process
// on the same disk: plain bbolt with one write transaction per row (or, for
// the counts, a full-table scan in one read transaction). Throughput is
// reported as rows/s; run with
//
//	go test -run '^$' -bench . -benchtime 2s ./boltstore/
//
// (the setup-heavy re-arm and counts benchmarks use -benchtime 3x).

const benchShards = 256

func benchStore(b *testing.B) *Store {
	b.Helper()
	reg := prometheus.NewRegistry()
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"), Options{ShardCount: benchShards, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		// Report the group-commit shape: ops per commit and ms per commit.
		mfs, _ := reg.Gather()
		var commits, ops, secs float64
		for _, mf := range mfs {
			h := mf.GetMetric()[0].GetHistogram()
			switch mf.GetName() {
			case "fairshard_store_batch_ops":
				commits, ops = float64(h.GetSampleCount()), h.GetSampleSum()
			case "fairshard_store_commit_duration_seconds":
				secs = h.GetSampleSum()
			}
		}
		if commits > 0 {
			b.Logf("%.0f commits, %.1f ops/commit, %.2f ms/commit", commits, ops/commits, 1000*secs/commits)
		}
		_ = s.Close()
	})
	return s
}

// naiveDB is the baseline: bbolt with the same options, one bucket of rows
// keyed by dispatch_key, plus a pending bucket keyed visible_after ‖ key so
// its claim is a seek too; one Update per row.
type naiveDB struct{ db *bolt.DB }

var (
	naiveRows    = []byte("rows")
	naivePending = []byte("pending")
)

func newNaive(b *testing.B) *naiveDB {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "naive.db"), 0o600, &bolt.Options{
		Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	err = db.Update(func(tx *bolt.Tx) error {
		for _, n := range [][]byte{naiveRows, naivePending} {
			if _, err := tx.CreateBucket(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return &naiveDB{db: db}
}

// appendRow is the naive insert-or-ignore: one transaction, one fsync.
func (n *naiveDB) appendRow(r *outbox.Row) error {
	enc := encodeRow(nil, r)
	return n.db.Update(func(tx *bolt.Tx) error {
		rows := tx.Bucket(naiveRows)
		if rows.Get([]byte(r.DispatchKey)) != nil {
			return nil
		}
		if err := rows.Put([]byte(r.DispatchKey), enc); err != nil {
			return err
		}
		return tx.Bucket(naivePending).Put(timeIndexKey(r.VisibleAfter, r.DispatchKey), present)
	})
}

// claimOne flips the oldest pending row to claimed in its own transaction.
func (n *naiveDB) claimOne(now time.Time) (string, error) {
	var key string
	err := n.db.Update(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(naivePending).Cursor().First()
		if k == nil {
			return nil
		}
		key = string(k[timeKeyLen:])
		if err := tx.Bucket(naivePending).Delete(append([]byte(nil), k...)); err != nil {
			return err
		}
		return n.setStatus(tx, key, outbox.StatusClaimed, now)
	})
	return key, err
}

func (n *naiveDB) setStatus(tx *bolt.Tx, key string, st outbox.Status, now time.Time) error {
	rows := tx.Bucket(naiveRows)
	r, err := decodeRow([]byte(key), rows.Get([]byte(key)))
	if err != nil {
		return err
	}
	r.Status = st
	if st == outbox.StatusClaimed {
		r.ClaimedAt = now
	} else {
		r.FinishedAt = now
	}
	return rows.Put([]byte(key), encodeRow(nil, &r))
}

func (n *naiveDB) complete(key string, now time.Time) error {
	return n.db.Update(func(tx *bolt.Tx) error { return n.setStatus(tx, key, outbox.StatusDone, now) })
}

func benchRow(p, i int, now time.Time) outbox.Row {
	r := outbox.Row{DispatchKey: fmt.Sprintf("wf-%02d-%09d:0", p, i), WorkflowID: fmt.Sprintf("wf-%02d-%09d", p, i),
		Namespace: fmt.Sprintf("ns%d", i%8), TaskQueue: "q", ActivityType: "send",
		Payload: []byte(`{"order":12345,"amount":"19.99","currency":"EUR"}`), ContentType: "application/json",
		Status: outbox.StatusPending, Attempt: 1, CreatedAt: now, VisibleAfter: now}
	return r
}

// runProducers splits b.N rows into batches taken by `producers` goroutines.
func runProducers(b *testing.B, producers, batch int, fn func(p int, rows []outbox.Row) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	b.ResetTimer()
	start := time.Now()
	for p := range producers {
		wg.Go(func() {
			rows := make([]outbox.Row, 0, batch)
			for {
				first := int(next.Add(int64(batch))) - batch
				if first >= b.N {
					return
				}
				rows = rows[:0]
				now := time.Now() // as a producer would: created (and visible) now
				for i := first; i < min(first+batch, b.N); i++ {
					rows = append(rows, benchRow(p, i, now))
				}
				if err := fn(p, rows); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if e := failed.Load(); e != nil {
		b.Fatal(*e)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "rows/s")
}

func BenchmarkAppend(b *testing.B) {
	for _, batch := range []int{1, 16, 256} {
		for _, producers := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("batch=%d/producers=%d/impl=boltstore", batch, producers), func(b *testing.B) {
				s := benchStore(b)
				runProducers(b, producers, batch, func(_ int, rows []outbox.Row) error {
					_, err := s.Append(context.Background(), rows)
					return err
				})
			})
			b.Run(fmt.Sprintf("batch=%d/producers=%d/impl=naive", batch, producers), func(b *testing.B) {
				n := newNaive(b)
				runProducers(b, producers, batch, func(_ int, rows []outbox.Row) error {
					for i := range rows {
						if err := n.appendRow(&rows[i]); err != nil {
							return err
						}
					}
					return nil
				})
			})
		}
	}
	// The target cell on a store holding 100,000 finished rows, as rows
	// (slim) or packed: what Append's dedupe probe of the bundles costs.
	for _, pack := range []bool{false, true} {
		b.Run(fmt.Sprintf("batch=16/producers=64/impl=boltstore/finished=%dk/packed=%v", finishedRows()/1000, pack), func(b *testing.B) {
			s := benchStore(b)
			preloadFinished(b, s, finishedRows(), pack)
			runProducers(b, 64, 16, func(_ int, rows []outbox.Row) error {
				_, err := s.Append(context.Background(), rows)
				return err
			})
		})
	}
	// The same target cell with random (UUID-like) dispatch keys: every row
	// lands on its own B+tree leaf, which is what key locality saves.
	b.Run("batch=16/producers=64/impl=boltstore/keys=random", func(b *testing.B) {
		s := benchStore(b)
		runProducers(b, 64, 16, func(p int, rows []outbox.Row) error {
			for i := range rows {
				h := xxhash.Sum64String(rows[i].DispatchKey)
				rows[i].DispatchKey = fmt.Sprintf("%016x-%016x:0", h, h*0x9e3779b97f4a7c15)
			}
			_, err := s.Append(context.Background(), rows)
			return err
		})
	})
}

// finishedRows is how many done rows the finished-store benchmarks preload
// (rows): 100,000, the figure recorded in docs/BENCHMARKS.md; 10,000 under
// -short, where make test runs every benchmark once only for its checks
// (three 100,000-row preloads took ~40 s of the gate).
func finishedRows() int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

// preloadFinished stores n done rows (keys "old-…", not the producers')
// as copies merged in large batches (untimed), packed into bundles when
// pack is set: what a node holds within the retention window.
func preloadFinished(b *testing.B, s *Store, n int, pack bool) {
	b.Helper()
	now := time.Now()
	for i := 0; i < n; i += 2048 {
		rows := make([]outbox.Row, 0, 2048)
		for j := i; j < min(i+2048, n); j++ {
			r := benchRow(0, j, now)
			r.DispatchKey = fmt.Sprintf("old-%09d:0", j)
			r.Status, r.Version, r.Version.Seq, r.FinishedAt = outbox.StatusDone, outbox.FirstVersion, 2, now.Add(time.Duration(j))
			rows = append(rows, r)
		}
		if _, err := s.Merge(context.Background(), rows); err != nil {
			b.Fatal(err)
		}
	}
	if pack {
		if got, err := packAll(context.Background(), s); err != nil || got != n {
			b.Fatalf("packed %d of %d: %v", got, n, err)
		}
	}
}

// preload appends n pending rows in large batches (untimed).
func preload(b *testing.B, s *Store, n int, now time.Time) {
	b.Helper()
	for i := 0; i < n; i += 2048 {
		rows := make([]outbox.Row, 0, 2048)
		for j := i; j < min(i+2048, n); j++ {
			rows = append(rows, benchRow(0, j, now))
		}
		if _, err := s.Append(context.Background(), rows); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimComplete is the dispatcher's cycle: one claimer takes
// batches of visible rows (as many as there are deliverers) and hands them
// to the deliverers, each of which completes its row on its own (as
// deliveries finish independently), while the pack pass packs the rows
// completed (as RunTombstoneGC does in a node). The naive baseline claims one row per
// transaction and completes it in another, from as many goroutines.
func BenchmarkClaimComplete(b *testing.B) {
	for _, workers := range []int{64, 512} {
		b.Run(fmt.Sprintf("deliverers=%d", workers), func(b *testing.B) { benchClaimComplete(b, workers) })
	}
}

func benchClaimComplete(b *testing.B, workers int) {
	b.Run("impl=boltstore", func(b *testing.B) {
		s := benchStore(b)
		now := time.Now()
		preload(b, s, b.N, now)
		ctx := context.Background()
		// The pack pass runs as in a node (every PackInterval), packing
		// the rows completed meanwhile.
		gcCtx, stopGC := context.WithCancel(ctx)
		gcDone := make(chan error, 1)
		go func() { gcDone <- s.RunTombstoneGC(gcCtx, time.Minute) }()
		defer func() {
			stopGC()
			if err := <-gcDone; err != nil {
				b.Error(err)
			}
		}()
		work := make(chan string, workers)
		var done atomic.Int64
		var wg sync.WaitGroup
		b.ResetTimer()
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for k := range work {
					if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: k, Claim: outbox.FirstVersion, Now: now}); err != nil {
						b.Error(err)
					}
					done.Add(1)
				}
			})
		}
		claimed := 0
		for claimed < b.N {
			rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: workers, Now: now})
			if err != nil {
				b.Fatal(err)
			}
			if len(rows) == 0 {
				b.Fatalf("ran dry after %d of %d", claimed, b.N)
			}
			for _, r := range rows {
				work <- r.DispatchKey
			}
			claimed += len(rows)
		}
		close(work)
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
	})
	b.Run("impl=naive", func(b *testing.B) {
		n := newNaive(b)
		now := time.Now()
		err := n.db.Update(func(tx *bolt.Tx) error {
			for i := range b.N {
				r := benchRow(0, i, now)
				if err := tx.Bucket(naiveRows).Put([]byte(r.DispatchKey), encodeRow(nil, &r)); err != nil {
					return err
				}
				if err := tx.Bucket(naivePending).Put(timeIndexKey(r.VisibleAfter, r.DispatchKey), present); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		var left atomic.Int64
		left.Store(int64(b.N))
		var wg sync.WaitGroup
		b.ResetTimer()
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					k, err := n.claimOne(now)
					if err == nil && k != "" {
						err = n.complete(k, now)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
	})
}

// BenchmarkRearmStale10k re-arms 10,000 stale claims among 100,000 rows
// (90,000 of them done tombstones). boltstore: one RearmStale call walking
// the claimed index. Naive: a scan of every row for stale claims, then one
// write transaction per re-armed row. One op = 10,000 rows re-armed.
func BenchmarkRearmStale10k(b *testing.B) {
	claims, total := 10_000, 100_000
	if testing.Short() {
		// make test runs every benchmark once with -short, for its checks:
		// the naive baseline's 10,000 fsync'd transactions take ~10 s.
		claims, total = 1_000, 10_000
	}
	b.Run("impl=boltstore", func(b *testing.B) {
		ctx := context.Background()
		var el time.Duration
		for range b.N {
			b.StopTimer()
			s := benchStore(b)
			now := time.Now()
			// 90,000 done tombstones (merged in as done: setup only), then
			// 10,000 appended and claimed rows.
			for i := claims; i < total; i += 4096 {
				rows := make([]outbox.Row, 0, 4096)
				for j := i; j < min(i+4096, total); j++ {
					r := benchRow(1, j, now)
					r.Status, r.FinishedAt = outbox.StatusDone, now
					rows = append(rows, r)
				}
				if _, err := s.Merge(ctx, rows); err != nil {
					b.Fatal(err)
				}
			}
			preload(b, s, claims, now)
			if rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: claims, Now: now}); err != nil || len(rows) != claims {
				b.Fatalf("claimed %d: %v", len(rows), err)
			}
			b.StartTimer()
			start := time.Now()
			rows, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: now.Add(time.Second), VisibleAfter: now, Limit: claims})
			el += time.Since(start)
			if err != nil || len(rows) != claims {
				b.Fatalf("re-armed %d: %v", len(rows), err)
			}
		}
		b.ReportMetric(float64(claims*b.N)/el.Seconds(), "rows/s")
	})
	b.Run("impl=naive", func(b *testing.B) {
		var el time.Duration
		for range b.N {
			b.StopTimer()
			n := newNaive(b)
			now := time.Now()
			err := n.db.Update(func(tx *bolt.Tx) error {
				for i := range total {
					r := benchRow(0, i, now)
					r.Status, r.FinishedAt = outbox.StatusDone, now
					if i%10 == 0 {
						r.Status, r.ClaimedAt, r.FinishedAt = outbox.StatusClaimed, now, time.Time{}
					}
					if err := tx.Bucket(naiveRows).Put([]byte(r.DispatchKey), encodeRow(nil, &r)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			var stale []string
			cut := now.Add(time.Second)
			err = n.db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(naiveRows).ForEach(func(k, v []byte) error {
					r, err := decodeRow(k, v)
					if err == nil && r.Status == outbox.StatusClaimed && r.ClaimedAt.Before(cut) {
						stale = append(stale, string(k))
					}
					return err
				})
			})
			if err != nil {
				b.Fatal(err)
			}
			for _, k := range stale {
				err := n.db.Update(func(tx *bolt.Tx) error {
					return n.setStatus(tx, k, outbox.StatusPending, now)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			el += time.Since(start)
			if len(stale) != claims {
				b.Fatalf("naive found %d stale", len(stale))
			}
		}
		b.ReportMetric(float64(claims*b.N)/el.Seconds(), "rows/s")
	})
}

// BenchmarkClaimedCounts10kNamespaces reads claimed counts for 10,000
// namespaces in one call (the planner's one bucketed read per sweep); each
// namespace holds 2 claimed and 2 pending rows (40,000 rows). boltstore
// reads counters (owning every shard, and owning half of them, which adds
// the foreign-shard subtraction). Naive: one read transaction scanning every
// row. Reported as namespaces/s and ms per call.
func BenchmarkClaimedCounts10kNamespaces(b *testing.B) {
	const nss = 10_000
	setup := func(b *testing.B) (*Store, []string) {
		s := benchStore(b)
		ctx := context.Background()
		now := time.Now()
		names := make([]string, nss)
		rows := make([]outbox.Row, 0, 4*nss)
		for i := range nss {
			names[i] = fmt.Sprintf("tenant-%05d", i)
			for j := range 4 {
				r := benchRow(0, i*4+j, now)
				r.Namespace = names[i]
				if j >= 2 {
					r.VisibleAfter = now.Add(time.Hour) // stays pending
				}
				rows = append(rows, r)
			}
		}
		for i := 0; i < len(rows); i += 4096 {
			if _, err := s.Append(ctx, rows[i:min(i+4096, len(rows))]); err != nil {
				b.Fatal(err)
			}
		}
		if got, err := s.Claim(ctx, outbox.ClaimParams{Limit: 2 * nss, Now: now}); err != nil || len(got) != 2*nss {
			b.Fatalf("claimed %d: %v", len(got), err)
		}
		return s, names
	}
	run := func(b *testing.B, s *Store, names []string) {
		ctx := context.Background()
		b.ResetTimer()
		for range b.N {
			m, err := s.CountClaimedByNamespace(ctx, names)
			if err != nil || len(m) != nss {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(nss*b.N)/b.Elapsed().Seconds(), "namespaces/s")
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/call")
	}
	b.Run("impl=boltstore/owned=all", func(b *testing.B) {
		s, names := setup(b)
		run(b, s, names)
	})
	b.Run("impl=boltstore/owned=half", func(b *testing.B) {
		s, names := setup(b)
		var half []uint32
		for i := uint32(0); i < benchShards; i += 2 {
			half = append(half, i)
		}
		s.SetOwnedShards(half)
		run(b, s, names)
	})
	b.Run("impl=naive-scan", func(b *testing.B) {
		s, names := setup(b)
		b.ResetTimer()
		for range b.N {
			m := make(map[string]int, nss)
			for _, n := range names {
				m[n] = 0
			}
			err := s.db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketRows).ForEach(func(k, v []byte) error {
					r, err := decodeRow(k, v)
					if err != nil {
						return err
					}
					if _, asked := m[r.Namespace]; asked && r.Status == outbox.StatusClaimed && s.Owns(shards.ShardOf(r.DispatchKey, benchShards)) {
						m[r.Namespace]++
					}
					return nil
				})
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(nss*b.N)/b.Elapsed().Seconds(), "namespaces/s")
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/call")
	})
}

// BenchmarkPackedRowLookup is the lookup Append's dedupe makes for every
// new row once rows are packed: a store holding 100,000 packed rows (256
// shards, ~400 a shard), keys absent (a new row: the common case) or
// present (a duplicate), inside one write transaction.
func BenchmarkPackedRowLookup(b *testing.B) {
	s := benchStore(b)
	finished := finishedRows()
	preloadFinished(b, s, finished, true)
	for _, present := range []bool{false, true} {
		b.Run(fmt.Sprintf("present=%v", present), func(b *testing.B) {
			keys := make([]string, 4096)
			for i := range keys {
				keys[i] = fmt.Sprintf("wf-%02d-%09d:0", i%64, i)
				if present {
					keys[i] = fmt.Sprintf("old-%09d:0", (i*7919)%finished)
				}
			}
			b.ResetTimer()
			err := s.submit(context.Background(), "lookup", 1, func(w *wtx) error {
				for i := range b.N {
					k := keys[i%len(keys)]
					ok, err := w.isBundled(shards.ShardOf(k, benchShards), k)
					if err != nil || ok != present {
						return fmt.Errorf("lookup %q: %v %v", k, ok, err)
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPackTombstones is the pack pass's cost per row: b.N slim done
// rows (stored as merged copies, untimed) packed by one PackTombstones
// into a store that already holds 100,000 packed rows (256 shards).
func BenchmarkPackTombstones(b *testing.B) {
	s := benchStore(b)
	preloadFinished(b, s, finishedRows(), true)
	now := time.Now()
	for i := 0; i < b.N; i += 2048 {
		rows := make([]outbox.Row, 0, 2048)
		for j := i; j < min(i+2048, b.N); j++ {
			r := benchRow(1, j, now)
			r.Status, r.Version, r.FinishedAt = outbox.StatusDone, outbox.Version{Seq: 2}, now.Add(time.Duration(j))
			rows = append(rows, r)
		}
		if _, err := s.Merge(context.Background(), rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	n, err := packAll(context.Background(), s)
	if err != nil || n != b.N {
		b.Fatalf("packed %d of %d: %v", n, b.N, err)
	}
}
