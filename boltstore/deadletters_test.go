package boltstore

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/outbox"
)

// TestDeadLetterPageByteBudget: a page stops at its byte budget (at least
// one row, however large), reports whether more follow, and can leave the
// payloads out while giving their sizes; paging by the last key visits
// every dead letter once.
func TestDeadLetterPageByteBudget(t *testing.T) {
	s, b := newTestStore(t)
	sizes := map[string]int{}
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		r := row(k, "ns", "q")
		r.Payload = []byte(strings.Repeat("x", (i%3+1)*100_000)) // 100, 200 or 300 kB
		sizes[k] = len(r.Payload)
		mustAppend(t, s, r)
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: k, Claim: claimOf(t, s, k), LastError: "422", Now: b.clock.Now()}))
	}
	const budget = 450_000
	var pages [][]string
	after := ""
	for {
		p, err := s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{After: after, Limit: 1000, MaxBytes: budget})
		must(t, err)
		if len(p.Rows) == 0 {
			t.Fatalf("empty page after %q", after)
		}
		total := 0
		for i, r := range p.Rows {
			total += outbox.RowBytes(&r)
			if len(r.Payload) != sizes[r.DispatchKey] || p.PayloadBytes[i] != sizes[r.DispatchKey] {
				t.Fatalf("row %q: payload %d bytes, PayloadBytes %d, want %d", r.DispatchKey, len(r.Payload), p.PayloadBytes[i], sizes[r.DispatchKey])
			}
		}
		if len(p.Rows) > 1 && total > budget {
			t.Fatalf("page of %d rows is %d bytes, budget %d", len(p.Rows), total, budget)
		}
		pages = append(pages, keysOfRows(p.Rows))
		after = p.Rows[len(p.Rows)-1].DispatchKey
		if !p.More {
			break
		}
	}
	// Payloads of 100, 200, 300, 100, 200, 300, ... kB: pages fill up to
	// 450 kB.
	want := [][]string{{"k0", "k1"}, {"k2", "k3"}, {"k4"}, {"k5", "k6"}, {"k7"}, {"k8", "k9"}}
	if !reflect.DeepEqual(pages, want) {
		t.Fatalf("pages %v, want %v", pages, want)
	}
	// One row larger than the budget still makes a page.
	p, err := s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{After: "k1", Limit: 10, MaxBytes: 1000})
	must(t, err)
	if !reflect.DeepEqual(keysOfRows(p.Rows), []string{"k2"}) || !p.More {
		t.Fatalf("page over budget: %v more=%v", keysOfRows(p.Rows), p.More)
	}
	// Without payloads every row fits, and the sizes are still given.
	p, err = s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{Limit: 1000, MaxBytes: budget, WithoutPayload: true})
	must(t, err)
	if len(p.Rows) != 10 || p.More {
		t.Fatalf("page without payloads: %d rows, more=%v", len(p.Rows), p.More)
	}
	for i, r := range p.Rows {
		if r.Payload != nil || p.PayloadBytes[i] != sizes[r.DispatchKey] || r.LastError != "422" || r.Status != outbox.StatusFailed {
			t.Fatalf("row without payload: %+v, size %d", r, p.PayloadBytes[i])
		}
	}
	// Limit cuts too, and says more follow; the last page says none do.
	p, err = s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{Limit: 3, WithoutPayload: true})
	must(t, err)
	if len(p.Rows) != 3 || !p.More {
		t.Fatalf("page of 3: %d rows, more=%v", len(p.Rows), p.More)
	}
	p, err = s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{After: "k6", Limit: 3, WithoutPayload: true})
	must(t, err)
	if !reflect.DeepEqual(keysOfRows(p.Rows), []string{"k7", "k8", "k9"}) || p.More {
		t.Fatalf("last page: %v more=%v", keysOfRows(p.Rows), p.More)
	}
	// Through ends the page at a key; More then speaks of rows before it.
	p, err = s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{After: "k2", Through: "k5", Limit: 10})
	must(t, err)
	if !reflect.DeepEqual(keysOfRows(p.Rows), []string{"k3", "k4", "k5"}) || p.More {
		t.Fatalf("page through k5: %v more=%v", keysOfRows(p.Rows), p.More)
	}
	p, err = s.ListDeadLetterPage(ctx, "ns", DeadLetterQuery{After: "k2", Through: "k5", Limit: 2})
	must(t, err)
	if !reflect.DeepEqual(keysOfRows(p.Rows), []string{"k3", "k4"}) || !p.More {
		t.Fatalf("page of 2 through k5: %v more=%v", keysOfRows(p.Rows), p.More)
	}
}
