package lease_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
)

// A coordinator's successor starts its term from the records the
// coordinator shipped it: a holder that does not report in the new term
// (the old coordinator's own node, stopped or dead, its rows possibly
// still at the target) keeps counting, during the learning and after it,
// until its lease and the drain have passed; a holder that reports
// replaces its record. Without the hand-off the successor would grant the
// stopped holder's share as soon as it stopped learning: 2 rows over the
// quota here.
func TestSuccessorCountsTheOldCoordinatorsSilentHolders(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 3) // a coordinates, done learning
	cfg := w.config()
	cfg.Drain = 5 * time.Second
	a := mustCoordinator(t, cfg)
	wantGrant(t, ask(t, a, clk.Now(), "a", "ns", 2, 2), 2) // a's own node holds 2
	wantGrant(t, ask(t, a, clk.Now(), "x", "ns", 3, 0), 1)
	ship := a.Handoff(clk.Now(), "a", func(string) []string { return []string{"b"} }, true)
	if len(ship["b"]) != 1 {
		t.Fatalf("hand-off %+v, want one for b", ship)
	}
	h := ship["b"][0]
	if h.From != "a" || len(h.Namespaces) != 1 || len(h.Namespaces[0].Records) != 2 {
		t.Fatalf("hand-off %+v, want a's two holders for b", ship)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}

	// a stops; b becomes the coordinator (a new term: it learns).
	wb := newWorld()
	wb.coordinate("ns", clk.Now(), 3)
	cfgB := wb.config()
	cfgB.Drain = cfg.Drain
	b := mustCoordinator(t, cfgB)
	if n := b.Inherit(clk.Now(), h); n != 1 {
		t.Fatalf("inherited %d namespaces, want 1", n)
	}
	wantGrant(t, ask(t, b, clk.Now(), "x", "ns", 3, 1), 1) // x reports its 1: confirmed
	st, _ := b.Status(clk.Now(), "ns")
	if st.Outstanding != 3 {
		t.Fatalf("successor's outstanding %d, want 3 (a's inherited 2 and x's 1): %+v", st.Outstanding, st)
	}
	clk.Advance(testLease) // learning over; a's grant expired, its rows may still run
	wantGrant(t, ask(t, b, clk.Now(), "y", "ns", 3, 0), 0)
	wantGrant(t, ask(t, b, clk.Now(), "x", "ns", 3, 1), 1)
	clk.Advance(cfg.Drain) // a's record forgotten: its share goes back
	wantGrant(t, ask(t, b, clk.Now(), "y", "ns", 3, 0), 1)
	if l := ask(t, b, clk.Now(), "x", "ns", 3, 1); l.Grant < 1 {
		t.Fatalf("x after a's record went: %+v", l)
	}
}

// A hand-off is validated field by field; a bad one names the field.
func TestHandoffValidation(t *testing.T) {
	good := lease.Handoff{From: "a", Namespaces: []lease.HandoffNamespace{{Namespace: "ns",
		Records: []lease.HandoffRecord{{Node: "x", Holding: 1, ExpiresMS: 10, ForgetMS: 20}}}}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		bad   func(h *lease.Handoff)
	}{
		{"from", func(h *lease.Handoff) { h.From = "" }},
		{"namespaces[0].namespace", func(h *lease.Handoff) { h.Namespaces[0].Namespace = "a b" }},
		{"namespaces[1].namespace", func(h *lease.Handoff) { h.Namespaces = append(h.Namespaces, h.Namespaces[0]) }},
		{"namespaces[0].records[1].node", func(h *lease.Handoff) {
			h.Namespaces[0].Records = append(h.Namespaces[0].Records, h.Namespaces[0].Records[0])
		}},
		{"namespaces[0].records[0].forget_ms", func(h *lease.Handoff) { h.Namespaces[0].Records[0].ForgetMS = 5 }},
	} {
		h := lease.Handoff{From: good.From, Namespaces: []lease.HandoffNamespace{{Namespace: "ns",
			Records: []lease.HandoffRecord{good.Namespaces[0].Records[0]}}}}
		tc.bad(&h)
		var fe *lease.FieldError
		if err := h.Validate(); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a field error naming it", tc.field, err)
		}
	}
	if _, err := lease.DecodeHandoff(strings.NewReader(`{"from":"a","namespaces":[],"extra":1}`)); err == nil {
		t.Error("an unknown field was accepted")
	}
}

// Inherited records seed a new term only: a state dropped while idle and
// started again in the same term starts empty; a shipment older than the
// last kept from its sender is ignored; records of two senders merge, per
// node the larger holding.
func TestInheritedRecordsSeedOnlyANewTerm(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now(), 4)
	cfg := w.config()
	cfg.Drain = 5 * time.Second
	b := mustCoordinator(t, cfg)
	rec := func(node string, holding uint32) lease.HandoffRecord {
		return lease.HandoffRecord{Node: node, Holding: holding, ExpiresMS: 60_000, ForgetMS: 65_000}
	}
	ship := func(from string, seq uint64, recs ...lease.HandoffRecord) {
		b.Inherit(clk.Now(), lease.Handoff{From: from, Seq: seq, Namespaces: []lease.HandoffNamespace{{Namespace: "ns", Records: recs}}})
	}
	ship("a", 2, rec("a", 1), rec("x", 1))
	ship("a", 1, rec("a", 3))                              // older: ignored
	ship("c", 5, rec("x", 2))                              // another sender: x's larger holding wins
	wantGrant(t, ask(t, b, clk.Now(), "y", "ns", 4, 0), 0) // learning
	st, _ := b.Status(clk.Now(), "ns")
	if st.Outstanding != 3 {
		t.Fatalf("outstanding %d, want 3 (a 1, x 2): %+v", st.Outstanding, st)
	}
	// Past the records' forget time the state empties and is dropped; a
	// shipment arriving now does not seed the same term again.
	clk.Advance(66 * time.Second)
	b.Expire(clk.Now())
	ship("a", 3, rec("a", 4))
	if l := ask(t, b, clk.Now(), "y", "ns", 4, 0); l.Grant == 0 {
		t.Fatalf("same term, state started again: %+v, want a grant (no seeding)", l)
	}
}

// Between full shipments only the namespaces where a node came to hold
// more than the last shipment said are shipped again.
func TestHandoffShipsGrownHoldingsBetweenFullRounds(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("one", clk.Now().Add(-time.Hour), 4)
	w.coordinate("two", clk.Now().Add(-time.Hour), 4)
	c := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, c, clk.Now(), "x", "one", 1, 0), 1)
	wantGrant(t, ask(t, c, clk.Now(), "x", "two", 1, 0), 1)
	to := func(string) []string { return []string{"s"} }
	names := func(all bool) []string {
		var out []string
		for _, h := range c.Handoff(clk.Now(), "self", to, all)["s"] {
			for _, ns := range h.Namespaces {
				out = append(out, ns.Namespace)
			}
		}
		slices.Sort(out)
		return out
	}
	if got := names(true); !slices.Equal(got, []string{"one", "two"}) {
		t.Fatalf("full shipment %v", got)
	}
	if got := names(false); len(got) != 0 {
		t.Fatalf("nothing grew, yet %v shipped", got)
	}
	wantGrant(t, ask(t, c, clk.Now(), "x", "two", 1, 1), 1) // the same holding: not grown
	wantGrant(t, ask(t, c, clk.Now(), "x", "one", 3, 1), 3) // grown
	if got := names(false); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("between full rounds %v shipped, want [one]", got)
	}
}
