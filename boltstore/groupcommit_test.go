package boltstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// blockWriter parks the writer goroutine inside a transaction until the
// returned release func is called, so a test can queue ops that will all
// land in the writer's next batch.
func blockWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	entered, gate := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.submit(ctx, "blocker", 1, func(w *wtx) error {
			select {
			case <-entered:
			default:
				close(entered)
			}
			<-gate
			return nil
		})
	}()
	<-entered
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(gate)
			if err := <-done; err != nil {
				t.Errorf("blocker: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0, 0
}

func TestGroupCommitCoalescesConcurrentAppends(t *testing.T) {
	s, b := newTestStore(t)
	release := blockWriter(t, s)
	commitsBefore, _ := histogramCount(t, b.reg, "fairshard_store_batch_ops")
	const producers = 50
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			out, err := s.Append(ctx, []outbox.Row{row(fmt.Sprintf("p%d", p), "ns", "q")})
			if err == nil && out[0] != outbox.AppendCreated {
				err = fmt.Errorf("outcome %v", out)
			}
			errs <- err
		})
	}
	poll.Eventually(t, 5*time.Second, "every producer's commit to queue", func() (bool, string) { return len(s.queue) == producers, "" })
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	commits, ops := histogramCount(t, b.reg, "fairshard_store_batch_ops")
	// The blocker's commit plus one commit for all 50 appends.
	if got := commits - commitsBefore; got != 2 {
		t.Fatalf("%d commits for 50 queued appends, want 2 (blocker + one group commit)", got)
	}
	if ops != producers+1 {
		t.Fatalf("batch ops sum %v, want %d", ops, producers+1)
	}
}

func TestGroupCommitIsolatesAFailingOp(t *testing.T) {
	s, b := newTestStore(t)
	mustAppend(t, s, row(keyOnShard("owned-by-nobody", 2), "ns", "q"))
	s.SetOwnedShards([]uint32{2}) // BeginTransfer(2) will fail inside the batch
	release := blockWriter(t, s)
	var wg sync.WaitGroup
	var appendErr1, appendErr2, transferErr error
	wg.Go(func() { _, appendErr1 = s.Append(ctx, []outbox.Row{row("before", "ns", "q")}) })
	poll.Eventually(t, 5*time.Second, "one queued commit", func() (bool, string) { return len(s.queue) == 1, "" })
	wg.Go(func() { _, transferErr = beginTransfer(s, 2, 10) })
	poll.Eventually(t, 5*time.Second, "two queued commits", func() (bool, string) { return len(s.queue) == 2, "" })
	wg.Go(func() { _, appendErr2 = s.Append(ctx, []outbox.Row{row("after", "ns", "q")}) })
	poll.Eventually(t, 5*time.Second, "three queued commits", func() (bool, string) { return len(s.queue) == 3, "" })
	release()
	wg.Wait()
	if !errors.Is(transferErr, ErrShardOwned) {
		t.Fatalf("failing op: %v, want ErrShardOwned", transferErr)
	}
	must(t, appendErr1)
	must(t, appendErr2)
	mustGet(t, s, "before")
	mustGet(t, s, "after")
	_ = b
}

// TestClaimedByShardWaitsForTheClaimInProgress: a claim batch reads the
// claim scope inside the writer's transaction, so one begun before a
// scope change can commit a claim after it. ClaimedByShard, which a new
// primary's handover check relies on (package replication), must count
// such a claim: it waits for the transaction in progress. Without the
// wait it answered at once from the last commit, with nothing claimed,
// and TestScaleIn (test/e2e) saw rows delivered twice across a leave.
func TestClaimedByShardWaitsForTheClaimInProgress(t *testing.T) {
	s, b := newTestStore(t)
	ctx := context.Background()
	r := row("in-flight", "ns", "q")
	mustAppend(t, s, r)
	shard := shards.ShardOf(r.DispatchKey, testShardCount)

	inTx, hold := make(chan struct{}), make(chan struct{})
	claimErr := make(chan error, 1)
	go func() {
		claimErr <- s.ClaimBatch(ctx, func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
			rows, err := claim(outbox.ClaimParams{Limit: 1, Now: b.clock.Now()})
			if err != nil || len(rows) != 1 {
				return fmt.Errorf("claim in the batch: %d rows, %v", len(rows), err)
			}
			close(inTx)
			<-hold // the claim is written, not committed
			return nil
		})
	}()
	<-inTx
	got := make(chan map[uint32]int64, 1)
	go func() {
		m, err := s.ClaimedByShard(ctx)
		if err != nil {
			t.Errorf("ClaimedByShard: %v", err)
		}
		got <- m
	}()
	select {
	case m := <-got:
		close(hold)
		t.Fatalf("ClaimedByShard answered %v while a claim of shard %d was being committed; want it to wait for that transaction", m, shard)
	case <-time.After(200 * time.Millisecond): // still waiting, as it should
	}
	close(hold)
	if err := <-claimErr; err != nil {
		t.Fatal(err)
	}
	if m := <-got; m[shard] != 1 {
		t.Fatalf("ClaimedByShard after the claim committed = %v, want shard %d: 1", m, shard)
	}
}

// TestClaimedByShardWaitEndsWithItsContext: while a write transaction is
// stuck (a stalled disk), ClaimedByShard's wait for it ends with the
// caller's context, so peers' States calls do not pile up behind it.
func TestClaimedByShardWaitEndsWithItsContext(t *testing.T) {
	s, _ := newTestStore(t)
	release := blockWriter(t, s)
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.ClaimedByShard(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ClaimedByShard behind a stuck write: %v, want the context's deadline", err)
	}
}
