package backpressure_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/outboxtest"
	"github.com/fairshard/fairshard/quota"
)

// batchStore wraps a real boltstore, counting ClaimBatch calls and
// optionally failing the n-th claim made inside a batch.
type batchStore struct {
	*boltstore.Store
	batches   atomic.Int64
	failClaim int // 1-based claim to fail inside each batch; 0: none
}

func (b *batchStore) ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error {
	b.batches.Add(1)
	return b.Store.ClaimBatch(ctx, func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
		n := 0
		return run(func(p outbox.ClaimParams) ([]outbox.Row, error) {
			n++
			if n == b.failClaim {
				return nil, errInjected
			}
			return claim(p)
		})
	})
}

func boltSetup(t *testing.T) (*backpressure.Planner, *batchStore) {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "bp.db"), boltstore.Options{ShardCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	p := backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, 0), nil),
		Claimed:  quota.CountFunc(s.CountClaimedByNamespace),
		Now:      func() time.Time { return outboxtest.T0 },
	})
	return p, &batchStore{Store: s}
}

func appendRows(t *testing.T, s outbox.Store, ns, tq string, n int) {
	t.Helper()
	rows := make([]outbox.Row, n)
	for i := range rows {
		rows[i] = outboxtest.Row(fmt.Sprintf("%s-%s-%05d", ns, tq, i), ns, tq)
	}
	if _, err := s.Append(ctx, rows); err != nil {
		t.Fatal(err)
	}
}

// The worked example holds on the one-transaction path too, and a whole
// sweep is one ClaimBatch.
func TestBatchSweepWorkedExampleOnBoltstore(t *testing.T) {
	p, s := boltSetup(t)
	for q := range 8 {
		appendRows(t, s, "bursty", fmt.Sprintf("q%d", q), 50)
	}
	appendRows(t, s, "quiet", "q", 1)
	sw, err := p.Sweep(ctx, s, backpressure.SweepRequest{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	got := perNamespace(sw.Rows)
	if got["bursty"] != 7 || got["quiet"] != 1 {
		t.Fatalf("claimed %v, want bursty:7 quiet:1", got)
	}
	if s.batches.Load() != 1 {
		t.Fatalf("%d ClaimBatch calls for one sweep, want 1", s.batches.Load())
	}
	for _, r := range sw.Rows {
		if got, _ := s.Get(ctx, r.DispatchKey); got.Status != outbox.StatusClaimed {
			t.Fatalf("row %s is %s after the sweep, want claimed", r.DispatchKey, got.Status)
		}
	}
}

// A failure inside the batch rolls every claim of the sweep back: no row
// is left claimed without being handed to delivery.
func TestBatchSweepFailureClaimsNothing(t *testing.T) {
	p, s := boltSetup(t)
	for _, ns := range []string{"a", "b", "c"} {
		appendRows(t, s, ns, "q", 5)
	}
	s.failClaim = 3
	sw, err := p.Sweep(ctx, s, backpressure.SweepRequest{Batch: 30})
	if !errors.Is(err, errInjected) {
		t.Fatalf("err %v, want the injected fault", err)
	}
	if len(sw.Rows) != 0 {
		t.Fatalf("failed batch returned %d rows, want 0", len(sw.Rows))
	}
	for _, ns := range []string{"a", "b", "c"} {
		if n, _ := s.CountClaimed(ctx, ns); n != 0 {
			t.Fatalf("namespace %s has %d claimed rows after a rolled-back sweep", ns, n)
		}
	}
	s.failClaim = 0
	if sw, err := p.Sweep(ctx, s, backpressure.SweepRequest{Batch: 30}); err != nil || len(sw.Rows) != 15 {
		t.Fatalf("retry sweep: %d rows, %v; want 15", len(sw.Rows), err)
	}
}
