package boltstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// snapshot returns every key s holds, and the subset a Claim on s could
// return at now (pending, visible, not in transfer, on an owned shard).
func snapshot(t *testing.T, s *Store, now time.Time) (held, claimable map[string]bool) {
	t.Helper()
	held, claimable = map[string]bool{}, map[string]bool{}
	must(t, s.view(ctx, "test", func(_ *bolt.Tx, b buckets) error {
		return b.rows.ForEach(func(k, v []byte) error {
			r, err := decodeRow(k, v)
			if err != nil {
				return err
			}
			held[r.DispatchKey] = true
			if r.Status == outbox.StatusPending && b.transfer.Get(k) == nil && s.Owns(r.Shard) && !r.VisibleAfter.After(now) {
				claimable[r.DispatchKey] = true
			}
			return nil
		})
	}))
	return held, claimable
}

// TestTwoNodeHandoffNeverDoubleClaimable drives two stores as two nodes
// through random appends, claims, settles, ownership changes, handoffs
// (some failing, some crashing between the receiver's merge and the
// sender's delete) and checks after every step that no row is claimable on
// both nodes, that no appended row is lost, and at the end that both files
// pass Check. A row is delivered by two nodes at once only after a crash
// left a resendable copy behind and ownership moved back before the resend
// (at-least-once; the dispatch_key lets the target deduplicate); without
// such a crash it must never happen.
func TestTwoNodeHandoffNeverDoubleClaimable(t *testing.T) {
	t.Parallel()
	nodes := make([]*Store, 2)
	bundles := make([]*testBundle, 2)
	for i := range nodes {
		nodes[i], bundles[i] = newTestStore(t)
	}
	now := bundles[0].clock.Now()
	rng := rand.New(rand.NewPCG(3, 4))
	owner := make([]int, testShardCount) // shard → node
	publish := func() {
		var owned [2][]uint32
		for sh, n := range owner {
			owned[n] = append(owned[n], uint32(sh))
		}
		for i, s := range nodes {
			s.SetOwnedShards(append([]uint32{}, owned[i]...))
		}
	}
	publish()
	var keys []string
	inFlight := map[string]int{}          // key → node delivering it
	claimV := map[string]outbox.Version{} // key → its claim's version (the settle fence)
	crashResent := map[string]bool{}      // keys merged by a receiver whose sender then crashed
	duplicates := 0
	steps := 600
	if testing.Short() {
		steps = 200
	}
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 3: // append to a random node (it keeps foreign rows durably)
			n := rng.IntN(2)
			var rows []outbox.Row
			for range 1 + rng.IntN(5) {
				k := fmt.Sprintf("k%04d", len(keys))
				keys = append(keys, k)
				rows = append(rows, row(k, fmt.Sprintf("ns%d", rng.IntN(2)), "q"))
			}
			mustAppend(t, nodes[n], rows...)
		case op < 5: // claim
			n := rng.IntN(2)
			got, err := nodes[n].Claim(ctx, outbox.ClaimParams{Limit: 1 + rng.IntN(4), Now: now})
			must(t, err)
			for _, r := range got {
				if other, ok := inFlight[r.DispatchKey]; ok {
					if !crashResent[r.DispatchKey] {
						t.Fatalf("step %d: %s claimed on node %d while node %d delivers it", step, r.DispatchKey, n, other)
					}
					duplicates++
					continue
				}
				inFlight[r.DispatchKey] = n
				claimV[r.DispatchKey] = r.Version
			}
		case op < 6: // settle one in-flight row
			for k, n := range inFlight {
				switch rng.IntN(3) {
				case 0:
					must(t, nodes[n].Complete(ctx, outbox.CompleteParams{DispatchKey: k, Claim: claimV[k], Now: now}))
				case 1:
					must(t, nodes[n].Retry(ctx, outbox.RetryParams{DispatchKey: k, Claim: claimV[k], NextAttempt: 2, VisibleAfter: now}))
				case 2:
					must(t, nodes[n].Fail(ctx, outbox.FailParams{DispatchKey: k, Claim: claimV[k], LastError: "x", Now: now}))
				}
				delete(inFlight, k)
				break
			}
		case op < 7: // ownership change: a random shard moves
			owner[rng.IntN(testShardCount)] = rng.IntN(2)
			publish()
		default: // one handoff round from a random node
			from := rng.IntN(2)
			to := 1 - from
			fs, err := nodes[from].ForeignShards(ctx)
			must(t, err)
			if len(fs) == 0 {
				continue
			}
			rows, err := beginTransfer(nodes[from], fs[rng.IntN(len(fs))], 1+rng.IntN(6))
			must(t, err)
			switch rng.IntN(4) {
			case 0: // send failed
				_, err = nodes[from].AbortTransfer(ctx, keysOfRows(rows))
				must(t, err)
			case 1: // receiver merged, sender crashed before deleting
				_, err = nodes[to].Merge(ctx, rows)
				must(t, err)
				for _, r := range rows {
					crashResent[r.DispatchKey] = true
				}
				nodes[from] = reopen(t, nodes[from], bundles[from])
				publish()
				// The restarted node re-arms the claims it died holding.
				_, err = nodes[from].RearmAllClaimed(ctx, now)
				must(t, err)
				for k, n := range inFlight {
					if n == from {
						delete(inFlight, k)
					}
				}
			default:
				_, err = nodes[to].Merge(ctx, rows)
				must(t, err)
				_, err = nodes[from].CompleteTransfer(ctx, keysOfRows(rows))
				must(t, err)
			}
		}
		heldA, claimA := snapshot(t, nodes[0], now)
		heldB, claimB := snapshot(t, nodes[1], now)
		for _, k := range keys {
			if claimA[k] && claimB[k] {
				t.Fatalf("step %d: %s claimable on both nodes", step, k)
			}
			if !heldA[k] && !heldB[k] {
				t.Fatalf("step %d: %s lost on both nodes", step, k)
			}
		}
	}
	for _, s := range nodes {
		mustCheck(t, s)
	}
	t.Logf("%d steps, %d rows, %d double deliveries after sender crashes", steps, len(keys), duplicates)
}
