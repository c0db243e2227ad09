package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// blockingTarget answers 200 once release is closed; a request whose
// client gives up is abandoned.
func blockingTarget(t *testing.T) (*target, chan struct{}) {
	release := make(chan struct{})
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	return tg, release
}

// TestReaperRearmsStaleButNotInFlight: a claim older than the visibility
// timeout that nobody delivers is re-armed (attempt kept); a claim just as
// old that this process is still delivering is not.
func TestReaperRearmsStaleButNotInFlight(t *testing.T) {
	tg, release := blockingTarget(t)
	clock := newFakeClock(t0)
	cfg := testConfig(static(tg.URL()))
	cfg.Now = clock.Now
	d, b := setup(t, cfg)
	defer drain(t, d)

	// "orphan" was claimed by a delivery that died (claimed directly,
	// never handed to this dispatcher).
	orphan := mkRow("orphan", "ns", "dead", t0)
	orphan.Attempt = 3
	mustAppend(t, b.store, orphan)
	if got, err := b.store.Claim(t.Context(), outbox.ClaimParams{Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "dead"}, Limit: 1, Now: clock.Now()}); err != nil || len(got) != 1 {
		t.Fatalf("claim orphan: %v %v", got, err)
	}
	// "live" is claimed and being delivered by this dispatcher (the
	// target holds it).
	mustAppend(t, b.store, mkRow("live", "ns", "q", t0))
	if sw, err := d.SweepOnce(t.Context()); err != nil || len(sw.Rows) != 1 {
		t.Fatalf("sweep: %d rows, %v", len(sw.Rows), err)
	}
	poll.Eventually(t, 5*time.Second, "live row at the target", func() (bool, string) { return tg.count("live") == 1, "" })

	// Younger than the visibility timeout: nothing is re-armed.
	if n, err := d.RearmOnce(t.Context()); err != nil || n != 0 {
		t.Fatalf("RearmOnce before the timeout: %d rows, %v; want 0", n, err)
	}
	clock.Advance(cfg.DeliveryTimeout + DefaultVisibilitySlack + time.Second)
	n, err := d.RearmOnce(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("RearmOnce after the timeout: %d rows, %v; want 1 (the orphan only)", n, err)
	}
	got := wantStatus(t, b.store, "orphan", outbox.StatusPending)
	if got.Attempt != 3 || !got.VisibleAfter.Equal(clock.Now()) {
		t.Fatalf("re-armed orphan: attempt %d visible_after %v; want attempt 3, visible now %v", got.Attempt, got.VisibleAfter, clock.Now())
	}
	wantStatus(t, b.store, "live", outbox.StatusClaimed)
	if v := testutil.ToFloat64(d.m.rearmed); v != 1 {
		t.Fatalf("fairshard_rows_rearmed_total = %v, want 1", v)
	}
	close(release)
	waitIdle(t, d)
	wantStatus(t, b.store, "live", outbox.StatusDone)
}

// TestRearmAllOnStart: claims made before the dispatcher was built (a
// previous run of the node) are re-armed; a claim made after is not.
func TestRearmAllOnStart(t *testing.T) {
	tg := newTarget(t, nil)
	clock := newFakeClock(t0)
	store := newStore(t)
	mustAppend(t, store, mkRow("a", "ns", "q", t0), mkRow("b", "ns", "q", t0), mkRow("c", "ns", "q2", t0))
	if got, _ := store.Claim(t.Context(), outbox.ClaimParams{Limit: 2, Now: clock.Now(), Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}}); len(got) != 2 {
		t.Fatalf("claimed %d rows before start, want 2", len(got))
	}
	clock.Advance(time.Second)
	cfg := testConfig(static(tg.URL()))
	cfg.Store, cfg.Now = store, clock.Now
	d, _ := setup(t, cfg)
	defer drain(t, d)
	clock.Advance(time.Second)
	// A claim made by this run (after New) must survive the start pass.
	if got, _ := store.Claim(t.Context(), outbox.ClaimParams{Limit: 1, Now: clock.Now()}); len(got) != 1 || got[0].DispatchKey != "c" {
		t.Fatalf("claim after start: %v", got)
	}
	n, err := d.RearmAllOnStart(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("RearmAllOnStart: %d rows, %v; want 2", n, err)
	}
	for _, k := range []string{"a", "b"} {
		if r := wantStatus(t, store, k, outbox.StatusPending); r.Attempt != 1 {
			t.Fatalf("row %s: attempt %d after re-arm, want 1 (unchanged)", k, r.Attempt)
		}
	}
	wantStatus(t, store, "c", outbox.StatusClaimed)
	if n, _ := d.RearmAllOnStart(t.Context()); n != 0 {
		t.Fatalf("second RearmAllOnStart re-armed %d rows, want 0", n)
	}
}

// TestGracefulDrainWaitsForInFlight: Drain stops claiming and returns only
// once the in-flight rows are settled; rows appended during the drain are
// not claimed.
func TestGracefulDrainWaitsForInFlight(t *testing.T) {
	tg, release := blockingTarget(t)
	d, b := setup(t, testConfig(static(tg.URL())))
	now := time.Now()
	mustAppend(t, b.store, mkRow("a", "ns", "q", now), mkRow("b", "ns", "q", now), mkRow("c", "ns", "q", now))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()
	poll.Eventually(t, 5*time.Second, "3 deliveries in flight at the target", func() (bool, string) { return tg.cur.Load() == 3, "" })

	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := d.Drain(short)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain with deliveries held: %v, want a deadline error", err)
	}
	// Claims have stopped: a new row stays pending even when woken.
	mustAppend(t, b.store, mkRow("late", "ns", "q", time.Now()))
	d.Wake()
	if _, err := d.SweepOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	close(release)
	long, cancelLong := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLong()
	if err := d.Drain(long); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	// Drain returned: every in-flight row is settled, no polling needed.
	for _, k := range []string{"a", "b", "c"} {
		wantStatus(t, b.store, k, outbox.StatusDone)
	}
	wantStatus(t, b.store, "late", outbox.StatusPending)
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Drain")
	}
	if err := d.Run(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("second Run: %v, want ErrStopped", err)
	}
}

// TestHardStopCancelsAndRestartRedelivers: cancelling Run's context
// abandons in-flight deliveries at once; their rows stay claimed, and the
// next dispatcher on the same store re-arms and delivers exactly them.
func TestHardStopCancelsAndRestartRedelivers(t *testing.T) {
	skipInLaterStorePass(t)
	for _, st := range storeKinds {
		t.Run(st.name, func(t *testing.T) { testHardStopRestart(t, st) })
	}
}

func testHardStopRestart(t *testing.T, st storeKind) {
	tg, _ := blockingTarget(t)
	store, restart := st.open(t)
	cfg := testConfig(static(tg.URL()))
	cfg.Store = store
	cfg.DeliveryTimeout = 30 * time.Second // a hard stop must not wait for it
	d, _ := setup(t, cfg)
	now := time.Now()
	var inflight []string
	for i := range 4 {
		k := fmt.Sprintf("k%d", i)
		inflight = append(inflight, k)
		mustAppend(t, store, mkRow(k, "ns", "q", now))
	}
	stop := run(t, d)
	poll.Eventually(t, 5*time.Second, "4 deliveries in flight", func() (bool, string) { return tg.cur.Load() == 4, "" })
	start := time.Now()
	stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("hard stop took %v", took)
	}
	for _, k := range inflight {
		if r := wantStatus(t, store, k, outbox.StatusClaimed); r.Attempt != 1 {
			t.Fatalf("abandoned row %s: attempt %d, want 1", k, r.Attempt)
		}
	}
	mustAppend(t, store, mkRow("fresh", "ns", "q", time.Now()))

	// The node restarts: the store is reopened from its data (boltstore:
	// the same file), a new dispatcher runs over it, the target is healthy.
	store = restart()
	tg2 := newTarget(t, nil)
	cfg2 := testConfig(static(tg2.URL()))
	cfg2.Store = store
	d2, _ := setup(t, cfg2)
	run(t, d2)
	poll.Eventually(t, 5*time.Second, "re-armed and fresh rows done", func() (bool, string) {
		for _, k := range append(inflight, "fresh") {
			if !statusIs(store, k, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	for _, k := range append(inflight, "fresh") {
		if c := tg2.count(k); c != 1 {
			t.Fatalf("row %s delivered %d times after restart, want 1", k, c)
		}
	}
	if v := testutil.ToFloat64(d2.m.rearmed); v != 4 {
		t.Fatalf("restart re-armed %v rows, want exactly the 4 in flight", v)
	}
}

// TestRunStopStress starts and stops dispatchers repeatedly, hard and
// graceful, with deliveries in flight; goleak (TestMain) checks that
// nothing is left behind.
func TestRunStopStress(t *testing.T) {
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Millisecond):
		case <-r.Context().Done():
		}
	})
	store := newStore(t)
	for i := range 20 {
		cfg := testConfig(static(tg.URL()))
		cfg.Store = store
		d, _ := setup(t, cfg)
		var rows []outbox.Row
		for j := range 5 {
			rows = append(rows, mkRow(fmt.Sprintf("r%d-%d", i, j), "ns", "q", time.Now()))
		}
		mustAppend(t, store, rows...)
		stop := run(t, d)
		d.Wake()
		if i%2 == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := d.Drain(ctx); err != nil {
				t.Fatalf("round %d: Drain: %v", i, err)
			}
			cancel()
		}
		stop()
		if n := d.InFlight(); n != 0 {
			t.Fatalf("round %d: %d deliveries in flight after Run returned", i, n)
		}
	}
	// Drain before Run: Run returns at once, nil; a second Run refuses.
	d, _ := setup(t, testConfig(static(tg.URL())))
	if err := d.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := d.Run(t.Context()); err != nil {
		t.Fatalf("Run after Drain: %v, want nil", err)
	}
	if err := d.Run(t.Context()); !errors.Is(err, ErrStopped) {
		t.Fatalf("second Run: %v, want ErrStopped", err)
	}
	if err := d.Drain(t.Context()); err != nil {
		t.Fatalf("Drain after a drained Run: %v", err)
	}
}
