package outbox_test

import (
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/outbox"
)

var t0 = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

// genRow draws a copy of the row "k": any status, a small version, and
// content drawn from few values so ties at equal versions happen often.
func genRow(t *rapid.T, label string) outbox.Row {
	st := rapid.SampledFrom([]outbox.Status{outbox.StatusPending, outbox.StatusClaimed,
		outbox.StatusDone, outbox.StatusFailed, outbox.StatusCancelled}).Draw(t, label+".status")
	r := outbox.Row{
		DispatchKey: "k", WorkflowID: "wf", Namespace: "ns", TaskQueue: "q", Shard: 3,
		Status:       st,
		Attempt:      uint32(rapid.IntRange(1, 3).Draw(t, label+".attempt")),
		VisibleAfter: t0.Add(time.Duration(rapid.IntRange(0, 2).Draw(t, label+".visible")) * time.Second),
		CreatedAt:    t0.Add(time.Duration(rapid.IntRange(-2, 0).Draw(t, label+".created")) * time.Second),
		LastError:    rapid.SampledFrom([]string{"", "503", "timeout"}).Draw(t, label+".last_error"),
		Version: outbox.Version{
			Gen: uint32(rapid.IntRange(0, 2).Draw(t, label+".gen")),
			Seq: uint64(rapid.IntRange(0, 3).Draw(t, label+".seq")),
		},
	}
	switch rapid.IntRange(0, 2).Draw(t, label+".payload") {
	case 0:
		r.Payload = nil
	case 1:
		r.Payload = []byte{}
	default:
		r.Payload = []byte("body")
	}
	r.ContentType = rapid.SampledFrom([]string{"", "application/json"}).Draw(t, label+".content_type")
	if st.Terminal() {
		r.FinishedAt = t0.Add(time.Duration(rapid.IntRange(1, 2).Draw(t, label+".finished")) * time.Second)
	}
	if st == outbox.StatusClaimed {
		r.ClaimedAt = t0.Add(time.Duration(rapid.IntRange(0, 1).Draw(t, label+".claimed")) * time.Second)
	}
	return r
}

func same(t *rapid.T, what string, got, want outbox.Row) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// TestMergeIsAJoin: Merge is commutative, associative and idempotent, and
// Compare is a total order consistent with it (the merged copy is at least
// as new as both inputs).
func TestMergeIsAJoin(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := genRow(t, "a"), genRow(t, "b"), genRow(t, "c")
		same(t, "idempotent Merge(a, a)", outbox.Merge(a, a), a)
		same(t, "commutative", outbox.Merge(a, b), outbox.Merge(b, a))
		same(t, "associative", outbox.Merge(outbox.Merge(a, b), c), outbox.Merge(a, outbox.Merge(b, c)))
		m := outbox.Merge(a, b)
		if outbox.Compare(m, a) < 0 || outbox.Compare(m, b) < 0 {
			t.Fatalf("merged copy is older than an input: %+v", m)
		}
		// Total order: antisymmetric and transitive.
		if ab, ba := outbox.Compare(a, b), outbox.Compare(b, a); sign(ab) != -sign(ba) {
			t.Fatalf("Compare(a,b)=%d Compare(b,a)=%d", ab, ba)
		}
		if outbox.Compare(a, b) <= 0 && outbox.Compare(b, c) <= 0 && outbox.Compare(a, c) > 0 {
			t.Fatal("Compare is not transitive")
		}
		// A terminal copy never loses to a live copy of its generation.
		if a.Status.Terminal() && !b.Status.Terminal() && a.Version.Gen >= b.Version.Gen && !m.Status.Terminal() {
			t.Fatalf("live copy %+v undid terminal %+v", b, a)
		}
		// A later generation always wins.
		if a.Version.Gen > b.Version.Gen && m.Version.Gen != a.Version.Gen {
			t.Fatalf("generation %d lost to %d", a.Version.Gen, b.Version.Gen)
		}
		// CreatedAt is the earlier of the two.
		want := a.CreatedAt
		if b.CreatedAt.Before(want) {
			want = b.CreatedAt
		}
		if !m.CreatedAt.Equal(want) {
			t.Fatalf("CreatedAt %v, want the earlier %v", m.CreatedAt, want)
		}
	})
}

func sign(c int) int {
	switch {
	case c < 0:
		return -1
	case c > 0:
		return 1
	}
	return 0
}

// TestTransitionsRaiseTheVersion: every state change but a claim produces a
// copy that Merge prefers over the copy it came from, so a stale copy of the
// earlier state never undoes it, whichever order they meet in.
func TestTransitionsRaiseTheVersion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := outbox.Row{DispatchKey: "k", Namespace: "ns", TaskQueue: "q"}
		outbox.NewRow(&r, t0)
		now := t0
		for i := range rapid.IntRange(1, 12).Draw(t, "steps") {
			before := r
			now = now.Add(time.Second)
			var applied bool
			switch op := rapid.IntRange(0, 6).Draw(t, "op"); op {
			case 0:
				applied = outbox.ApplyClaim(&r, now)
			case 1:
				applied = outbox.ApplyRearm(&r, now)
			case 2:
				applied = outbox.ApplyRetry(&r, outbox.RetryParams{Claim: r.Version, VisibleAfter: now, LastError: "503"})
			case 3:
				applied = outbox.ApplyComplete(&r, outbox.CompleteParams{Claim: r.Version}, now)
			case 4:
				applied = outbox.ApplyFail(&r, outbox.FailParams{Claim: r.Version, LastError: "400"}, now)
			case 5:
				applied = outbox.ApplyCancel(&r, outbox.CancelParams{Reason: "operator"}, now)
			case 6:
				applied = outbox.ApplyRedrive(&r, now)
			}
			if !applied {
				same(t, "a transition that did not apply", r, before)
				continue
			}
			if outbox.Compare(r, before) <= 0 {
				t.Fatalf("step %d: %s → %s did not produce a newer copy (%v → %v)", i, before.Status, r.Status, before.Version, r.Version)
			}
			same(t, "stale copy merged after", outbox.Merge(r, before), r)
			same(t, "stale copy merged before", outbox.Merge(before, r), r)
		}
	})
}

// The three cases the issue names, spelled out.
func TestMergeCases(t *testing.T) {
	base := outbox.Row{DispatchKey: "k", Namespace: "ns", TaskQueue: "q", Payload: []byte("p")}
	outbox.NewRow(&base, t0)

	t.Run("redrive beats a stale dead-letter copy", func(t *testing.T) {
		claimed := base
		outbox.ApplyClaim(&claimed, t0)
		dead := claimed
		if !outbox.ApplyFail(&dead, outbox.FailParams{Claim: claimed.Version, LastError: "400"}, t0) {
			t.Fatal("fail did not apply")
		}
		redriven := dead
		if !outbox.ApplyRedrive(&redriven, t0.Add(time.Minute)) {
			t.Fatal("redrive did not apply")
		}
		// A node that missed the redrive still holds the dead letter, even
		// with more changes counted on it.
		stale := dead
		stale.Version.Seq += 10
		for _, m := range []outbox.Row{outbox.Merge(redriven, stale), outbox.Merge(stale, redriven)} {
			if m.Status != outbox.StatusPending || m.Version != redriven.Version {
				t.Fatalf("merged %s %v, want the redriven pending row %v", m.Status, m.Version, redriven.Version)
			}
		}
	})

	t.Run("terminal beats live of the same generation", func(t *testing.T) {
		done := base
		outbox.ApplyClaim(&done, t0)
		outbox.ApplyComplete(&done, outbox.CompleteParams{Claim: done.Version}, t0)
		live := base
		live.Version.Seq = done.Version.Seq + 5 // retried and re-armed many times elsewhere
		live.Attempt = 7
		for _, m := range []outbox.Row{outbox.Merge(done, live), outbox.Merge(live, done)} {
			if m.Status != outbox.StatusDone {
				t.Fatalf("merged %s, want done", m.Status)
			}
		}
		// Between terminals of a generation: done > cancelled > failed.
		failed, cancelled := done, done
		failed.Status, cancelled.Status = outbox.StatusFailed, outbox.StatusCancelled
		failed.Version.Seq, cancelled.Version.Seq = 99, 50
		if m := outbox.Merge(failed, outbox.Merge(cancelled, done)); m.Status != outbox.StatusDone {
			t.Fatalf("merged %s, want done", m.Status)
		}
		if m := outbox.Merge(failed, cancelled); m.Status != outbox.StatusCancelled {
			t.Fatalf("merged %s, want cancelled", m.Status)
		}
	})

	t.Run("claimed vs pending", func(t *testing.T) {
		claimed := base
		outbox.ApplyClaim(&claimed, t0)
		// The copy it was claimed from (a handoff resend, a replica).
		if m := outbox.Merge(base, claimed); m.Status != outbox.StatusClaimed {
			t.Fatalf("claim undone by the pending copy it came from: %s", m.Status)
		}
		// A claimed copy arriving elsewhere is normalised to pending first
		// and still loses to the local claim.
		incoming := claimed
		outbox.NormalizeIncoming(&incoming, t0)
		if m := outbox.Merge(claimed, incoming); m.Status != outbox.StatusClaimed || !m.ClaimedAt.Equal(t0) {
			t.Fatalf("local claim lost to its normalised copy: %+v", m)
		}
		// A re-arm moves past the claim: the stale claimed copy loses.
		rearmed := claimed
		outbox.ApplyRearm(&rearmed, t0.Add(time.Minute))
		if m := outbox.Merge(claimed, rearmed); m.Status != outbox.StatusPending || m.Version != rearmed.Version {
			t.Fatalf("re-armed row lost to the stale claim: %+v", m)
		}
	})
}

// TestSettleFences: a settle applies only to the claim it names.
func TestSettleFences(t *testing.T) {
	r := outbox.Row{DispatchKey: "k", Namespace: "ns", TaskQueue: "q"}
	outbox.NewRow(&r, t0)
	outbox.ApplyClaim(&r, t0)
	first := r.Version
	outbox.ApplyRearm(&r, t0) // the first claim outlived its visibility timeout
	outbox.ApplyClaim(&r, t0.Add(time.Second))
	second := r.Version
	if first == second {
		t.Fatal("two claims share a version")
	}
	for name, apply := range map[string]func(*outbox.Row) bool{
		"complete": func(r *outbox.Row) bool { return outbox.ApplyComplete(r, outbox.CompleteParams{Claim: first}, t0) },
		"retry":    func(r *outbox.Row) bool { return outbox.ApplyRetry(r, outbox.RetryParams{Claim: first}) },
		"fail":     func(r *outbox.Row) bool { return outbox.ApplyFail(r, outbox.FailParams{Claim: first}, t0) },
	} {
		c := r
		if apply(&c) {
			t.Fatalf("%s of the re-armed claim applied to the new claim", name)
		}
	}
	// The current claim settles.
	if !outbox.ApplyRetry(&r, outbox.RetryParams{Claim: second, VisibleAfter: t0}) {
		t.Fatal("retry of the current claim did not apply")
	}
	// A late success of a re-armed, not re-claimed row is recorded...
	if c := r; !outbox.ApplyComplete(&c, outbox.CompleteParams{Claim: second}, t0) || c.Status != outbox.StatusDone {
		t.Fatal("late success after a re-arm not recorded")
	}
	// ...but not a late retry or failure.
	if c := r; outbox.ApplyFail(&c, outbox.FailParams{Claim: second}, t0) || outbox.ApplyRetry(&c, outbox.RetryParams{Claim: second}) {
		t.Fatal("late failure of a re-armed claim applied")
	}
}

func TestDigestOf(t *testing.T) {
	r := outbox.Row{DispatchKey: "k", Status: outbox.StatusPending, Version: outbox.Version{Gen: 1, Seq: 4}}
	claimed := r
	claimed.Status = outbox.StatusClaimed
	if outbox.DigestOf(&r) != outbox.DigestOf(&claimed) {
		t.Fatal("claimed and pending copies of one version hash apart")
	}
	for _, other := range []outbox.Row{
		{DispatchKey: "k", Status: outbox.StatusDone, Version: r.Version},
		{DispatchKey: "k", Status: outbox.StatusPending, Version: outbox.Version{Gen: 1, Seq: 5}},
		{DispatchKey: "k", Status: outbox.StatusPending, Version: outbox.Version{Gen: 2, Seq: 4}},
		{DispatchKey: "k2", Status: outbox.StatusPending, Version: r.Version},
	} {
		if outbox.DigestOf(&r) == outbox.DigestOf(&other) {
			t.Fatalf("%+v and %+v hash alike", r, other)
		}
	}
	var d outbox.ShardDigest
	d.Add(&r)
	d.Add(&claimed)
	d.Remove(&r)
	if d.Rows != 1 || d.Sum != outbox.DigestOf(&claimed) {
		t.Fatalf("digest after add, add, remove: %+v", d)
	}
}
