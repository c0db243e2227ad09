package waiting_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/waiting"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

var t0 = time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)

// ready is a pending, visible row of an owned shard with a target and
// headroom: nothing holds it back.
func ready() waiting.Facts {
	return waiting.Facts{
		Row: outbox.Row{DispatchKey: "wf:1", WorkflowID: "wf", Namespace: "ns", TaskQueue: "q",
			Status: outbox.StatusPending, Attempt: 1, VisibleAfter: t0.Add(-time.Second), Shard: 7},
		Now: t0, Node: "a", Owner: "a", OwnsShard: true, HasTarget: true,
		Quota: 8, Fraction: shards.NewOwnedShardFraction(2, 8), ClaimedHeld: 1,
	}
}

// exact turns f into the same facts in the exact quota mode: the ceiling
// is a lease grant of 2 from coordinator b, this node wanting 5.
func exact(f *waiting.Facts) {
	f.Exact, f.HasCeiling, f.Ceiling, f.Coordinator, f.Wants = true, true, 2, "b", 5
}

// expect is what Explain must answer for a case.
type expect struct {
	want     waiting.Reason
	also     []waiting.Reason
	contains string // in the message
}

// TestExplain runs every case in both quota modes (DESIGN.md "Exact
// cluster-wide quota"): proportional, where the ceiling is the planner's
// ceil(8 × 2/8) = 2, and exact (the case's edit applied after exact),
// where it is the lease grant; a case's exactly expectation, when set,
// replaces the proportional one in exact mode.
func TestExplain(t *testing.T) {
	cases := []struct {
		name     string
		edit     func(*waiting.Facts)
		want     waiting.Reason
		also     []waiting.Reason
		contains string // in the message
		exactly  *expect
		check    func(t *testing.T, w *waiting.Waiting)
	}{
		{name: "claimable", edit: func(*waiting.Facts) {}, want: waiting.Claimable, contains: "next sweep",
			check: func(t *testing.T, w *waiting.Waiting) {
				if w.Claimed == nil || *w.Claimed != 1 || w.Ceiling == nil || *w.Ceiling != 2 || *w.Quota != 8 || *w.OwnedShardFraction != 0.25 {
					t.Errorf("numbers: claimed %v ceiling %v quota %v fraction %v; want 1, 2 (ceil(8×2/8) or the grant), 8, 0.25", w.Claimed, w.Ceiling, w.Quota, w.OwnedShardFraction)
				}
				switch w.QuotaMode {
				case "proportional":
					if w.Coordinator != "" || w.Wants != nil {
						t.Errorf("proportional mode: coordinator %q wants %v, want neither", w.Coordinator, w.Wants)
					}
				case "exact":
					if w.Coordinator != "b" || w.Wants == nil || *w.Wants != 5 {
						t.Errorf("exact mode: coordinator %q wants %v, want b and 5", w.Coordinator, w.Wants)
					}
				default:
					t.Errorf("quota_mode %q", w.QuotaMode)
				}
			}},
		{name: "claimed", edit: func(f *waiting.Facts) {
			f.Row.Status, f.Row.ClaimedAt, f.Paused = outbox.StatusClaimed, t0, true
		}, want: waiting.Claimed, contains: "being delivered",
			check: func(t *testing.T, w *waiting.Waiting) {
				if w.ClaimedAt == nil || !w.ClaimedAt.Equal(t0) {
					t.Errorf("claimed_at %v, want %v", w.ClaimedAt, t0)
				}
			}},
		{name: "in transfer", edit: func(f *waiting.Facts) { f.OwnsShard, f.Owner = false, "b" },
			want: waiting.InTransfer, contains: "owned by b",
			check: func(t *testing.T, w *waiting.Waiting) {
				if w.Ceiling != nil || w.Owner != "b" || w.Node != "a" {
					t.Errorf("a row held for another owner: ceiling %v owner %q node %q", w.Ceiling, w.Owner, w.Node)
				}
			}},
		{name: "paused", edit: func(f *waiting.Facts) { f.Paused = true }, want: waiting.NamespacePaused, contains: `"ns" is paused`},
		{name: "no target", edit: func(f *waiting.Facts) { f.HasTarget = false }, want: waiting.NoTarget, contains: "ns/q"},
		{name: "held", edit: func(f *waiting.Facts) { f.Held = true }, want: waiting.WorkflowHeld, contains: `"wf" is held`},
		{name: "retry backoff", edit: func(f *waiting.Facts) {
			f.Row.Attempt, f.Row.LastError, f.Row.VisibleAfter = 3, "503 Service Unavailable", t0.Add(1500*time.Millisecond)
		}, want: waiting.RetryBackoff, contains: "Attempt 2 failed (503 Service Unavailable); attempt 3 is due at 2026-12-01T02:00:01.5Z (in 1.5s)",
			check: func(t *testing.T, w *waiting.Waiting) {
				if w.VisibleAfter == nil || w.Attempt != 3 || w.LastError != "503 Service Unavailable" {
					t.Errorf("visible_after %v attempt %d last_error %q", w.VisibleAfter, w.Attempt, w.LastError)
				}
			}},
		{name: "delayed", edit: func(f *waiting.Facts) { f.Row.VisibleAfter = t0.Add(time.Minute) },
			want: waiting.Delayed, contains: "in 1m0s"},
		{name: "at ceiling", edit: func(f *waiting.Facts) { f.ClaimedHeld = 2 }, want: waiting.NamespaceAtCeiling,
			contains: "2 claimed rows on a, its per-node ceiling is 2 (quota 8 × 2/8 shards owned, rounded up)",
			exactly:  &expect{want: waiting.NamespaceAtCeiling, contains: "2 claimed rows on a and its lease grant is 2 of the exact quota 8 (coordinator b; a wants 5)"}},
		{name: "quota zero", edit: func(f *waiting.Facts) { f.Quota, f.Ceiling, f.ClaimedHeld = 0, 0, 0 }, want: waiting.NamespaceAtCeiling,
			contains: "ceiling is 0", exactly: &expect{want: waiting.NamespaceAtCeiling, contains: "lease grant is 0 of the exact quota 0"}},
		{name: "no grant yet for a claimable row", edit: func(f *waiting.Facts) { f.Ceiling, f.Wants, f.ClaimedHeld = 0, 0, 0 },
			want: waiting.Claimable, exactly: &expect{want: waiting.NamespaceAtCeiling, contains: "lease grant is 0 of the exact quota 8 (coordinator b; a wants 0)"}},
		{name: "in backoff, nothing asked: the zero grant is no cause", edit: func(f *waiting.Facts) {
			f.Ceiling, f.Wants, f.ClaimedHeld = 0, 0, 0
			f.Row.Attempt, f.Row.VisibleAfter = 2, t0.Add(time.Second)
		}, want: waiting.RetryBackoff},
		{name: "in backoff with the namespace at its ceiling", edit: func(f *waiting.Facts) {
			f.ClaimedHeld = 2
			f.Row.Attempt, f.Row.VisibleAfter = 2, t0.Add(time.Second)
		}, want: waiting.RetryBackoff, also: []waiting.Reason{waiting.NamespaceAtCeiling}},
		{name: "paused: the zeroed ceiling is no cause", edit: func(f *waiting.Facts) { f.Paused, f.Ceiling, f.Wants = true, 0, 0 },
			want: waiting.NamespacePaused},
		{name: "host slots full", edit: func(f *waiting.Facts) {
			f.Host, f.HostLimit, f.HostInFlight, f.HostShare, f.HostNamespaceInFlight, f.HostAllowance = "https://hooks.example.com:443", 4, 4, 2, 2, 0
		}, want: waiting.HostSlotsFull, contains: "Target host https://hooks.example.com:443 has 4 rows in flight from a, its limit is 4, and namespace \"ns\" has 2 of them (its share 2)",
			check: func(t *testing.T, w *waiting.Waiting) {
				if w.Host != "https://hooks.example.com:443" || w.HostLimit == nil || *w.HostLimit != 4 || *w.HostInFlight != 4 {
					t.Errorf("host numbers: %q %v %v", w.Host, w.HostLimit, w.HostInFlight)
				}
			}},
		{name: "host with a free slot: claimable", edit: func(f *waiting.Facts) {
			f.Host, f.HostLimit, f.HostInFlight, f.HostShare, f.HostAllowance = "http://h:80", 4, 3, 4, 1
		}, want: waiting.Claimable},
		{name: "claimed count unknown: no ceiling judged", edit: func(f *waiting.Facts) { f.ClaimedHeld, f.ClaimedUnknown = 5, true },
			want: waiting.Claimable},
		{name: "several causes: first in check order, others in also", edit: func(f *waiting.Facts) {
			f.Paused, f.Held, f.ClaimedHeld = true, true, 9
			f.Row.Attempt, f.Row.VisibleAfter = 2, t0.Add(time.Second)
		}, want: waiting.NamespacePaused, also: []waiting.Reason{waiting.WorkflowHeld, waiting.RetryBackoff}},
	}
	for _, mode := range []string{"proportional", "exact"} {
		for _, tc := range cases {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				f := ready()
				e := expect{tc.want, tc.also, tc.contains}
				if mode == "exact" {
					exact(&f)
					if tc.exactly != nil {
						e = *tc.exactly
					}
				}
				tc.edit(&f)
				w := waiting.Explain(f)
				if w == nil {
					t.Fatal("Explain = nil for a live row")
				}
				var also []string
				for _, rs := range e.also {
					also = append(also, string(rs))
				}
				if w.Reason != string(e.want) || !slices.Equal(w.Also, also) {
					t.Fatalf("reason %q also %v, want %q also %v (message %q)", w.Reason, w.Also, e.want, e.also, w.Message)
				}
				if !strings.Contains(w.Message, e.contains) || !strings.HasSuffix(w.Message, ".") {
					t.Errorf("message %q: want a sentence containing %q", w.Message, e.contains)
				}
				if tc.check != nil {
					tc.check(t, w)
				}
			})
		}
	}
}

func TestExplainTerminal(t *testing.T) {
	for _, st := range []outbox.Status{outbox.StatusDone, outbox.StatusFailed, outbox.StatusCancelled} {
		f := ready()
		f.Row.Status = st
		if w := waiting.Explain(f); w != nil {
			t.Errorf("%s row: waiting %+v, want nil", st, w)
		}
	}
}
