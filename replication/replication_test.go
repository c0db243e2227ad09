package replication_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/transfer"
)

func transferLimits() transfer.Limits { return transfer.Limits{MaxRows: 100, MaxBytes: 64 << 10} }

func authOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testSecret {
			http.Error(w, `{"error":{"code":"unauthorized","message":"no"}}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func waitSynced(t *testing.T, c *tcluster) {
	t.Helper()
	eventually(t, 20*time.Second, "replica sets synced and agreeing", c.converged)
}

// Every appended row is durable on each member of its replica set before
// the append is answered, whichever node received it.
func TestRouteWritesEveryReplica(t *testing.T) {
	c := newTCluster(t, 64, 2, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("k", 300, time.Now().UTC())
	out, err := c.nodes["a"].repl.Route(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	v := c.view("a")
	for i, o := range out {
		key := rows[i].DispatchKey
		set := v.Sets[rows[i].Shard]
		if o.Status != outbox.AppendCreated || o.Copies != 2 || o.Node != set[0] {
			t.Fatalf("row %s: outcome %+v, want created with 2 copies by the primary %s", key, o, set[0])
		}
		if got := c.holders(key); !slices.Equal(got, sortedCopy(set)) {
			t.Fatalf("row %s is held by %v, want its replica set %v", key, got, set)
		}
	}
	// A retry of the same batch is answered as duplicates, still 2 copies.
	out, err = c.nodes["b"].repl.Route(ctx, rowsFor("k", 300, time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Status != outbox.AppendDuplicate || o.Copies != 2 {
			t.Fatalf("retry of row %d: %+v, want duplicate with 2 copies", i, o)
		}
	}
	waitSynced(t, c)
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// With a replica down (still in the view, as before failure detection)
// and write-copies 2, the append fails with ErrInsufficientCopies; once
// the view drops it and a replacement is synced, appends succeed again.
func TestWriteRefusedWhileCopiesUnmet(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	c.kill("b", false) // the view still lists b
	_, err := c.nodes["a"].repl.Route(ctx, rowsFor("down", 20, time.Now().UTC()))
	if !errors.Is(err, replication.ErrInsufficientCopies) {
		t.Fatalf("append with a replica down: %v, want ErrInsufficientCopies", err)
	}
	if v := metric(t, c.nodes["a"], "fairshard_replication_writes_total", "insufficient_copies"); v < 1 {
		t.Errorf("writes_total{insufficient_copies} = %v", v)
	}
	// Failure detected: a alone. Seeded, so the minimum stays 2: refused.
	c.apply()
	if got := c.nodes["a"].repl.WriteCopies(); got != 2 {
		t.Fatalf("write copies alone (seeded) = %d, want 2", got)
	}
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("alone", 5, time.Now().UTC())); !errors.Is(err, replication.ErrInsufficientCopies) {
		t.Fatalf("append with one member left: %v, want ErrInsufficientCopies", err)
	}
	st := c.nodes["a"].repl.Status()
	if !st.UnderReplicated || st.Copies != 1 || st.Factor != 2 {
		t.Fatalf("status alone: %+v, want under-replicated with 1 copy of 2", st)
	}
	// A replacement joins and syncs: appends succeed, and the rows stored
	// by the refused attempts (never reported) are replicated too.
	c.add("d")
	c.apply()
	waitSynced(t, c)
	out, err := c.nodes["a"].repl.Route(ctx, rowsFor("down", 20, time.Now().UTC()))
	if err != nil {
		t.Fatalf("append after the replacement synced: %v", err)
	}
	for i, o := range out {
		if o.Copies != 2 {
			t.Fatalf("row %d: %+v, want 2 copies", i, o)
		}
		if h := c.holders(rowsFor("down", 20, time.Time{})[i].DispatchKey); len(h) != 2 {
			t.Fatalf("row %d held by %v", i, h)
		}
	}
}

