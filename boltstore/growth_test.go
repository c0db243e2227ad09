package boltstore

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// TestFileGrowthUnderChurn churns 200,000 rows through append → claim →
// complete → tombstone expiry (retention 1 min on the injected clock, 30 s
// of fake time per round of 2,000 rows, so about 4,000–6,000 rows are
// live or tombstoned at any time) and asserts the file stops growing once
// that working set is steady: the final size is under 1.5× the size after
// the first quarter. bbolt never shrinks a file, so this fails if freed
// pages are not reused (a leaked read transaction, a missing delete, an
// index that keeps growing).
func TestFileGrowthUnderChurn(t *testing.T) {
	volumeTest(t)
	t.Parallel()
	const total, round, completers = 200_000, 2_000, 512
	s, b := newTestStore(t, func(o *Options) { o.TombstoneRetention = time.Minute; o.ShardCount = 256 })
	size := func() int64 {
		fi, err := os.Stat(b.path)
		must(t, err)
		return fi.Size()
	}
	start := time.Now()
	var quarter int64
	work := make(chan string, round)
	var wg, roundDone sync.WaitGroup
	errs := make(chan error, completers)
	for range completers {
		wg.Go(func() {
			for k := range work {
				if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: k, Claim: outbox.FirstVersion, Now: b.clock.Now()}); err != nil {
					errs <- err
				}
				roundDone.Done()
			}
		})
	}
	defer func() { close(work); wg.Wait() }()
	for n := 0; n < total; n += round {
		rows := make([]outbox.Row, round)
		for i := range rows {
			rows[i] = row(fmt.Sprintf("wf-%07d:0", n+i), fmt.Sprintf("ns%d", i%10), fmt.Sprintf("q%d", i%3))
		}
		mustAppend(t, s, rows...)
		claimed, err := s.Claim(ctx, outbox.ClaimParams{Limit: round, Now: b.clock.Now()})
		must(t, err)
		if len(claimed) != round {
			t.Fatalf("round %d: claimed %d of %d", n/round, len(claimed), round)
		}
		roundDone.Add(len(claimed))
		for _, r := range claimed {
			work <- r.DispatchKey
		}
		roundDone.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		b.clock.Advance(30 * time.Second)
		if _, err := s.ExpireTombstones(ctx); err != nil {
			t.Fatal(err)
		}
		if n+round == total/4 {
			quarter = size()
		}
	}
	final := size()
	commits, ops := histogramCount(t, b.reg, "fairshard_store_batch_ops")
	_, secs := histogramCount(t, b.reg, "fairshard_store_commit_duration_seconds")
	t.Logf("%d commits, %.1f ops/commit, %.2f ms/commit", commits, ops/float64(commits), 1000*secs/float64(commits))
	t.Logf("200,000 rows churned in %s: file %d KiB after the first quarter, %d KiB at the end (%.2fx)",
		time.Since(start).Round(time.Millisecond), quarter>>10, final>>10, float64(final)/float64(quarter))
	if float64(final) >= 1.5*float64(quarter) {
		t.Fatalf("file grew from %d to %d bytes under a steady working set (≥ 1.5×)", quarter, final)
	}
	st, err := s.NamespaceStats(ctx)
	must(t, err)
	tombs := 0
	for _, v := range st {
		tombs += v.Done
		if v.Pending+v.Claimed != 0 {
			t.Fatalf("rows left live: %+v", v)
		}
	}
	if tombs > 2*round {
		t.Fatalf("%d tombstones left, retention should keep at most ~%d", tombs, 2*round)
	}
}
