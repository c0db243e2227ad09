package outbox_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/outbox"
)

func slimmed(r outbox.Row) outbox.Row {
	outbox.Slim(&r)
	return r
}

// TestSlimCommutesWithMerge: slimming a tombstone before or after a merge
// gives the same row, whichever copies were slimmed. So nodes that slim at
// different moments (a node finishing the row, a node receiving the
// finished copy, an older node that kept the payload) converge on the same
// state, and Merge stays a join over slim rows.
func TestSlimCommutesWithMerge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genRow(t, "a"), genRow(t, "b")
		want := slimmed(outbox.Merge(a, b))
		same(t, "Merge(slim a, slim b)", outbox.Merge(slimmed(a), slimmed(b)), want)
		same(t, "Merge(slim a, b) slimmed", slimmed(outbox.Merge(slimmed(a), b)), want)
		same(t, "Merge(a, slim b) slimmed", slimmed(outbox.Merge(a, slimmed(b))), want)
		sa := slimmed(a)
		same(t, "idempotent on slim rows", outbox.Merge(sa, sa), sa)
		if outbox.DigestOf(&a) != outbox.DigestOf(&sa) {
			t.Fatalf("slimming changed the digest of %+v", a)
		}
		if sa.Version != a.Version || sa.Status != a.Status {
			t.Fatalf("slimming changed the state: %+v → %+v", a, sa)
		}
	})
}

// TestSlimTombstones: the transitions that finish a row for good slim it; a
// dead letter keeps its payload (redrive needs it); a slim tombstone wins
// against a full live copy of its generation, and an incoming full
// tombstone is slimmed before it is merged.
func TestSlimTombstones(t *testing.T) {
	base := outbox.Row{DispatchKey: "k", WorkflowID: "wf", Namespace: "ns", TaskQueue: "q",
		ActivityType: "email", Payload: []byte(`{"to":"a@b"}`), ContentType: "application/json"}
	outbox.NewRow(&base, t0)
	claimed := base
	outbox.ApplyClaim(&claimed, t0)

	done := claimed
	if !outbox.ApplyComplete(&done, outbox.CompleteParams{Claim: claimed.Version}, t0) {
		t.Fatal("complete did not apply")
	}
	cancelled := base
	if !outbox.ApplyCancel(&cancelled, outbox.CancelParams{Reason: "operator"}, t0) {
		t.Fatal("cancel did not apply")
	}
	for _, r := range []outbox.Row{done, cancelled} {
		if !outbox.IsSlim(&r) || r.Payload != nil || r.ContentType != "" {
			t.Fatalf("%s row kept its payload: %+v", r.Status, r)
		}
		// What the row lookup shows stays.
		if r.WorkflowID != "wf" || r.Namespace != "ns" || r.TaskQueue != "q" || r.ActivityType != "email" ||
			r.Attempt != 1 || r.FinishedAt.IsZero() || r.CreatedAt.IsZero() {
			t.Fatalf("%s row lost what the lookup needs: %+v", r.Status, r)
		}
	}
	if cancelled.LastError != "operator" {
		t.Fatalf("cancel reason %q", cancelled.LastError)
	}

	failed := claimed
	if !outbox.ApplyFail(&failed, outbox.FailParams{Claim: claimed.Version, LastError: "400"}, t0) {
		t.Fatal("fail did not apply")
	}
	if outbox.IsSlim(&failed) || string(failed.Payload) != `{"to":"a@b"}` || failed.ContentType != "application/json" {
		t.Fatalf("dead letter lost its payload: %+v", failed)
	}
	if outbox.Slim(&failed) {
		t.Fatal("Slim dropped the payload of a dead letter")
	}
	redriven := failed
	if !outbox.ApplyRedrive(&redriven, t0) || string(redriven.Payload) != `{"to":"a@b"}` {
		t.Fatalf("redriven row without its payload: %+v", redriven)
	}

	// The slim tombstone against full live copies of its generation, even
	// ones with a later change counter (retried elsewhere): the tombstone
	// wins, and the result needs no payload (it is never delivered again).
	live := base
	live.Version.Seq = done.Version.Seq + 3
	for _, l := range []outbox.Row{base, claimed, live} {
		for _, m := range []outbox.Row{outbox.Merge(done, l), outbox.Merge(l, done)} {
			if m.Status != outbox.StatusDone || m.Version != done.Version || !outbox.IsSlim(&m) {
				t.Fatalf("merge of slim done %v with live %s %v gave %+v", done.Version, l.Status, l.Version, m)
			}
		}
	}

	// A full copy of the same tombstone (from a node that kept the
	// payload) is slimmed on arrival and then equals the local one.
	full := done
	full.Payload, full.ContentType = base.Payload, base.ContentType
	incoming := full
	outbox.NormalizeIncoming(&incoming, t0)
	if !outbox.IsSlim(&incoming) {
		t.Fatalf("incoming tombstone not slimmed: %+v", incoming)
	}
	if c := outbox.Compare(outbox.Merge(done, incoming), done); c != 0 {
		t.Fatalf("merge with the slimmed incoming copy changed the row (%d)", c)
	}
	if outbox.DigestOf(&full) != outbox.DigestOf(&done) {
		t.Fatal("full and slim copies of one tombstone hash apart")
	}
	// Live rows are never slimmed.
	for _, l := range []outbox.Row{base, claimed, redriven} {
		if c := l; outbox.Slim(&c) || c.Payload == nil {
			t.Fatalf("Slim touched a live %s row", l.Status)
		}
	}
}
