package boltstore

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

func TestHandoffTransferLifecycle(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	const lost = 3
	var onLost []string
	for i := range 5 {
		onLost = append(onLost, keyOnShard(fmt.Sprintf("lost%d", i), lost))
	}
	kept := keyOnShard("zkept", 4) // sorts after the lost rows: the first claim takes a lost one
	for _, k := range onLost {
		mustAppend(t, s, row(k, "ns", "q"))
	}
	mustAppend(t, s, row(kept, "ns", "q"))
	// onLost[0] claimed (must wait), onLost[1] done (tombstone travels).
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: now, Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}}); err != nil {
		t.Fatal(err)
	}
	claimedKey := ""
	for _, k := range onLost {
		if r := mustGet(t, s, k); r.Status == outbox.StatusClaimed {
			claimedKey = k
		}
	}
	if claimedKey == "" {
		// The first claimed row was not on the lost shard: claim until one is.
		t.Fatalf("test setup: expected the oldest row to be on shard %d", lost)
	}
	var doneKey string
	for _, k := range onLost {
		if k != claimedKey {
			doneKey = k
			break
		}
	}
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: doneKey, Now: now}))

	if fs, _ := s.ForeignShards(ctx); len(fs) != 0 {
		t.Fatalf("foreign shards while owning all: %v", fs)
	}
	var owned []uint32
	for i := range uint32(testShardCount) {
		if i != lost {
			owned = append(owned, i)
		}
	}
	s.SetOwnedShards(owned)
	if fs, _ := s.ForeignShards(ctx); !reflect.DeepEqual(fs, []uint32{lost}) {
		t.Fatalf("foreign shards %v, want [%d]", fs, lost)
	}
	if _, err := s.BeginTransfer(ctx, 4, 10); !errors.Is(err, ErrShardOwned) {
		t.Fatalf("begin transfer of an owned shard: %v", err)
	}
	if _, err := s.BeginTransfer(ctx, testShardCount, 10); !errors.Is(err, ErrShardOwned) {
		t.Fatalf("begin transfer of an out-of-range shard: %v", err)
	}

	batch1, err := s.BeginTransfer(ctx, lost, 2)
	must(t, err)
	batch2, err := s.BeginTransfer(ctx, lost, 10)
	must(t, err)
	if len(batch1) != 2 || len(batch2) != 2 {
		t.Fatalf("batches %v %v, want 2 + 2 (4 transferable, the claimed row waits)", keysOfRows(batch1), keysOfRows(batch2))
	}
	for _, r := range append(batch1, batch2...) {
		if r.DispatchKey == claimedKey {
			t.Fatalf("claimed row %s offered for transfer", claimedKey)
		}
	}
	if rest, _ := s.BeginTransfer(ctx, lost, 10); len(rest) != 0 {
		t.Fatalf("rows offered twice: %v", keysOfRows(rest))
	}
	if fs, _ := s.ForeignShards(ctx); len(fs) != 0 {
		t.Fatalf("foreign shards with everything in transfer: %v", fs)
	}
	// In-transfer rows are never claimable, even if the shard comes back.
	s.SetOwnedShards(append(owned, lost))
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now}); !equalStrings(keysOfRows(rows), []string{kept}) {
		t.Fatalf("claim with rows in transfer: %v, want only %s", keysOfRows(rows), kept)
	}
	s.SetOwnedShards(owned)

	// Abort batch 1: its rows are transferable again.
	if n, err := s.AbortTransfer(ctx, keysOfRows(batch1)); err != nil || n != 2 {
		t.Fatalf("abort: %d %v", n, err)
	}
	// Settling a marked row clears its mark: CompleteTransfer must keep it.
	var pendingInBatch2 string
	for _, r := range batch2 {
		if r.Status == outbox.StatusPending {
			pendingInBatch2 = r.DispatchKey
		}
	}
	if pendingInBatch2 != "" {
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: pendingInBatch2, LastError: "cancelled by admin", Now: now}))
	}
	n, err := s.CompleteTransfer(ctx, append(keysOfRows(batch2), "never-marked"))
	must(t, err)
	wantDeleted := 2
	if pendingInBatch2 != "" {
		wantDeleted = 1
		if r := mustGet(t, s, pendingInBatch2); r.Status != outbox.StatusFailed {
			t.Fatalf("changed row deleted or altered by CompleteTransfer: %+v", r)
		}
	}
	if n != wantDeleted {
		t.Fatalf("complete transfer deleted %d, want %d", n, wantDeleted)
	}
	mustCheck(t, s)

	// Marks do not survive a restart (the sender crashed mid-transfer).
	again, err := s.BeginTransfer(ctx, lost, 10)
	must(t, err)
	if len(again) == 0 {
		t.Fatal("nothing to resend after abort")
	}
	s = reopen(t, s, b)
	s.SetOwnedShards(owned)
	resend, err := s.BeginTransfer(ctx, lost, 10)
	must(t, err)
	if !equalStrings(keysOfRows(resend), keysOfRows(again)) {
		t.Fatalf("after reopen %v, want the unacknowledged %v again", keysOfRows(resend), keysOfRows(again))
	}
	// Finish: the claimed row settles, then it is transferable too.
	_, _ = s.AbortTransfer(ctx, keysOfRows(resend))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: claimedKey, Now: now}))
	for {
		batch, err := s.BeginTransfer(ctx, lost, 2)
		must(t, err)
		if len(batch) == 0 {
			break
		}
		if _, err := s.CompleteTransfer(ctx, keysOfRows(batch)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range onLost {
		if _, err := s.Get(ctx, k); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("%s still here after the handoff: %v", k, err)
		}
	}
	if fs, _ := s.ForeignShards(ctx); len(fs) != 0 {
		t.Fatalf("foreign shards after draining: %v", fs)
	}
}

func TestMergeRules(t *testing.T) {
	t0 := newFakeClock().Now()
	pending := func(attempt uint32, vis time.Duration) outbox.Row {
		r := row("k", "ns", "q")
		r.Status, r.Attempt, r.VisibleAfter, r.CreatedAt = outbox.StatusPending, attempt, t0.Add(vis), t0.Add(vis)
		return r
	}
	with := func(r outbox.Row, st outbox.Status, lastErr string) outbox.Row {
		r.Status, r.LastError = st, lastErr
		if st.Terminal() {
			r.FinishedAt = t0.Add(time.Minute)
		}
		if st == outbox.StatusClaimed {
			r.ClaimedAt = t0
		}
		return r
	}
	cases := []struct {
		name      string
		existing  *outbox.Row // nil: absent; claimed rows are produced by a real Claim
		incoming  outbox.Row
		wantOut   string // created | updated | skipped
		wantState outbox.Status
		wantErr   string // LastError of the stored row afterwards
	}{
		{"absent: created", nil, pending(1, 0), "created", outbox.StatusPending, ""},
		{"absent incoming claimed: stored pending", nil, with(pending(1, 0), outbox.StatusClaimed, ""), "created", outbox.StatusPending, ""},
		{"absent incoming tombstone: created", nil, with(pending(1, 0), outbox.StatusDone, ""), "created", outbox.StatusDone, ""},
		{"existing terminal beats incoming pending", ptr(with(pending(1, 0), outbox.StatusDone, "here")), pending(5, time.Hour), "skipped", outbox.StatusDone, "here"},
		{"existing terminal kept over incoming terminal", ptr(with(pending(1, 0), outbox.StatusFailed, "here")), with(pending(1, 0), outbox.StatusDone, "there"), "skipped", outbox.StatusFailed, "here"},
		{"incoming terminal beats existing pending", ptr(pending(1, 0)), with(pending(1, 0), outbox.StatusDone, "there"), "updated", outbox.StatusDone, "there"},
		{"incoming terminal beats existing claimed", ptr(with(pending(1, 0), outbox.StatusClaimed, "")), with(pending(1, 0), outbox.StatusCancelled, "there"), "updated", outbox.StatusCancelled, "there"},
		{"existing claimed not overwritten by incoming pending", ptr(with(pending(1, 0), outbox.StatusClaimed, "")), pending(9, time.Hour), "skipped", outbox.StatusClaimed, ""},
		{"both pending: higher incoming attempt wins", ptr(pending(1, 0)), with(pending(2, -time.Hour), outbox.StatusPending, "retry"), "updated", outbox.StatusPending, "retry"},
		{"both pending: lower incoming attempt loses", ptr(with(pending(3, 0), outbox.StatusPending, "here")), pending(2, time.Hour), "skipped", outbox.StatusPending, "here"},
		{"both pending, same attempt: later visible_after wins", ptr(pending(2, 0)), with(pending(2, time.Minute), outbox.StatusPending, "later"), "updated", outbox.StatusPending, "later"},
		{"both pending, same attempt, same visible_after: existing kept", ptr(with(pending(2, 0), outbox.StatusPending, "here")), with(pending(2, 0), outbox.StatusPending, "there"), "skipped", outbox.StatusPending, "here"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, b := newTestStore(t)
			if tc.existing != nil {
				seed := *tc.existing
				wantClaimed := seed.Status == outbox.StatusClaimed
				if wantClaimed {
					seed.Status = outbox.StatusPending
				}
				if c, u, sk, err := s.Merge(ctx, []outbox.Row{seed}); err != nil || c != 1 || u+sk != 0 {
					t.Fatalf("seed: %d %d %d %v", c, u, sk, err)
				}
				if wantClaimed {
					if rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: b.clock.Now().Add(24 * time.Hour)}); err != nil || len(rows) != 1 {
						t.Fatalf("seed claim: %v %v", rows, err)
					}
				}
			}
			c, u, sk, err := s.Merge(ctx, []outbox.Row{tc.incoming})
			must(t, err)
			got := map[string]int{"created": c, "updated": u, "skipped": sk}
			if got[tc.wantOut] != 1 || c+u+sk != 1 {
				t.Fatalf("merge outcome %v, want %s", got, tc.wantOut)
			}
			r := mustGet(t, s, "k")
			if r.Status != tc.wantState || r.LastError != tc.wantErr {
				t.Fatalf("stored %s %q, want %s %q", r.Status, r.LastError, tc.wantState, tc.wantErr)
			}
			if tc.existing != nil && r.CreatedAt.After(tc.existing.CreatedAt) {
				t.Fatalf("CreatedAt %v later than the existing row's %v", r.CreatedAt, tc.existing.CreatedAt)
			}
			// Resending the same batch changes nothing (handoff resends are harmless).
			if c, u, _, err := s.Merge(ctx, []outbox.Row{tc.incoming}); err != nil || c+u != 0 {
				t.Fatalf("resend: created %d updated %d %v", c, u, err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestMergeValidatesWholeBatchAndClearsMarks(t *testing.T) {
	s, b := newTestStore(t)
	good := row("good", "ns", "q")
	bad := row("bad", "ns", "q")
	bad.Status = "weird"
	if _, _, _, err := s.Merge(ctx, []outbox.Row{good, bad}); !errors.Is(err, outbox.ErrInvalidRow) {
		t.Fatalf("merge with an invalid status: %v", err)
	}
	if _, err := s.Get(ctx, "good"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("part of a rejected merge was written: %v", err)
	}
	// A merge that changes a row in transfer clears its mark.
	k := keyOnShard("x", 5)
	mustAppend(t, s, row(k, "ns", "q"))
	s.SetOwnedShards([]uint32{0})
	if rows, err := s.BeginTransfer(ctx, 5, 10); err != nil || len(rows) != 1 {
		t.Fatalf("begin: %v %v", rows, err)
	}
	done := row(k, "ns", "q")
	done.Status, done.FinishedAt = outbox.StatusDone, b.clock.Now()
	if _, u, _, err := s.Merge(ctx, []outbox.Row{done}); err != nil || u != 1 {
		t.Fatalf("merge over marked row: %d %v", u, err)
	}
	if n, _ := s.CompleteTransfer(ctx, []string{k}); n != 0 {
		t.Fatal("CompleteTransfer deleted a row changed since BeginTransfer")
	}
}

// TestBeginTransferSharedGroupAndWrap: with 64 shards, shards 3, 19, 35 and
// 51 share one byshard group. BeginTransfer(3) must return only shard 3's
// rows, resume where it stopped, and after an abort wrap around to resend
// the unmarked rows.
func TestBeginTransferSharedGroupAndWrap(t *testing.T) {
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 64 })
	shardOf64 := func(k string) uint32 { return shards.ShardOf(k, 64) }
	var want []string
	for i := 0; len(want) < 7; i++ {
		k := fmt.Sprintf("k%03d", i)
		r := row(k, "ns", "q")
		r.CreatedAt = b.clock.Now().Add(time.Duration(i) * time.Second)
		switch shardOf64(k) {
		case 3:
			want = append(want, k)
			mustAppend(t, s, r)
		case 19, 35, 51:
			mustAppend(t, s, r)
		}
	}
	var owned []uint32
	for i := range uint32(64) {
		if i != 3 {
			owned = append(owned, i)
		}
	}
	s.SetOwnedShards(owned)
	b1, err := s.BeginTransfer(ctx, 3, 3)
	must(t, err)
	b2, err := s.BeginTransfer(ctx, 3, 3)
	must(t, err)
	if !equalStrings(append(keysOfRows(b1), keysOfRows(b2)...), want[:6]) {
		t.Fatalf("batches %v %v, want %v in CreatedAt order", keysOfRows(b1), keysOfRows(b2), want[:6])
	}
	if n, err := s.AbortTransfer(ctx, keysOfRows(b1)); err != nil || n != 3 {
		t.Fatalf("abort: %d %v", n, err)
	}
	// Resumes after b2's last row, then wraps to the aborted rows.
	b3, err := s.BeginTransfer(ctx, 3, 10)
	must(t, err)
	if got := keysOfRows(b3); !equalStrings(got, append([]string{want[6]}, want[:3]...)) {
		t.Fatalf("after abort: %v, want %v then the aborted %v", got, want[6], want[:3])
	}
	if rest, _ := s.BeginTransfer(ctx, 3, 10); len(rest) != 0 {
		t.Fatalf("rows offered twice: %v", keysOfRows(rest))
	}
	for _, r := range append(b2, b3...) {
		if r.Shard != 3 {
			t.Fatalf("row %s of shard %d returned for shard 3", r.DispatchKey, r.Shard)
		}
	}
}

// A row handed back to us while we were sending it away (two views that
// disagree, or ownership flipping back) must survive our own pending
// CompleteTransfer: the other side has given its copy up. Found by review:
// Merge used to skip the identical row and leave its in-transfer mark, so
// CompleteTransfer deleted the last copy.
func TestMergeBackWhileInTransferKeepsRow(t *testing.T) {
	s, _ := newTestStore(t)
	key := keyOnShard("bounce", 3)
	mustAppend(t, s, row(key, "ns", "q"))
	s.SetOwnedShards([]uint32{0, 1, 2})
	sent, err := s.BeginTransfer(ctx, 3, 10)
	if err != nil || len(sent) != 1 {
		t.Fatalf("BeginTransfer: %d rows, %v", len(sent), err)
	}
	// The receiver bounces the same row straight back.
	if _, _, _, err := s.Merge(ctx, sent); err != nil {
		t.Fatal(err)
	}
	// The receiver's ack of our first send now arrives.
	n, err := s.CompleteTransfer(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("CompleteTransfer deleted %d rows, want 0: the row came back", n)
	}
	if got := mustGet(t, s, key); got.Status != outbox.StatusPending {
		t.Fatalf("row %q is %s, want pending and present", key, got.Status)
	}
	// And it is transferable again, not stuck marked.
	if again, err := s.BeginTransfer(ctx, 3, 10); err != nil || len(again) != 1 {
		t.Fatalf("second BeginTransfer: %d rows, %v; want the row again", len(again), err)
	}
	mustCheck(t, s)
}
