package replication_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
)

// TestEveryRowChangeOfTheStoreReachesTheBackups enumerates the methods of
// replication.Store by reflection: each is a read, a claim (not shipped by
// design: a new primary treats a claimed row as pending), or a change of a
// row whose effect must reach the backup's copy. A method added later
// fails the test until it is classified, and a change is classified only
// with a case that shows it shipped.
func TestEveryRowChangeOfTheStoreReachesTheBackups(t *testing.T) {
	const S = 16
	c := newTCluster(t, S, 2)
	// Polls only on membership changes: digest repair cannot fix a copy
	// within the test, only what the store ships can.
	c.opts = func(cfg *replication.Config) { cfg.PollInterval = time.Hour }
	c.startSynced("a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	st := replication.NewStore(a.store, a.repl)
	ctx := context.Background()

	reads := []string{"Get", "PendingRoutes", "CountClaimedHeld", "NamespaceStats", "ListDeadLetterPage", "Attempts", "ListRows"}
	claims := []string{"Claim", "ClaimBatch"}

	seq := 0
	// fresh appends a pending row of a shard a is primary of (b holds the
	// other copy) and returns its key.
	fresh := func() string {
		t.Helper()
		for {
			seq++
			key := fmt.Sprintf("change-%d", seq)
			if set := c.view("a").Sets[shards.ShardOf(key, S)]; set[0] != "a" {
				continue
			}
			now := time.Now().UTC()
			if _, err := a.repl.Route(ctx, []outbox.Row{{DispatchKey: key, Namespace: "ns", TaskQueue: "q", CreatedAt: now, VisibleAfter: now}}); err != nil {
				t.Fatal(err)
			}
			return key
		}
	}
	claimed := func(key string) outbox.Row {
		t.Helper()
		rows, err := st.Claim(ctx, outbox.ClaimParams{Limit: 1000, Now: time.Now().UTC().Add(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.DispatchKey == key {
				return r
			}
		}
		t.Fatalf("%s not claimed", key)
		return outbox.Row{}
	}
	failed := func() string {
		t.Helper()
		key := fresh()
		r := claimed(key)
		if err := st.Fail(ctx, outbox.FailParams{DispatchKey: key, Claim: r.Version, LastError: "no", Now: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		// The dead letter is on the backup before the change under test,
		// so that change's own shipping is what the case sees.
		poll.Eventually(t, 10*time.Second, "the dead letter on the backup", func() (bool, string) {
			got, err := b.store.Get(ctx, key)
			return err == nil && got.Status == outbox.StatusFailed, fmt.Sprintf("%s %v", got.Status, err)
		})
		return key
	}
	changes := map[string]func() string{
		"Complete": func() string {
			key := fresh()
			r := claimed(key)
			if err := st.Complete(ctx, outbox.CompleteParams{DispatchKey: key, Claim: r.Version, Now: time.Now().UTC()}); err != nil {
				t.Fatal(err)
			}
			return key
		},
		"Retry": func() string {
			key := fresh()
			r := claimed(key)
			if err := st.Retry(ctx, outbox.RetryParams{DispatchKey: key, Claim: r.Version, NextAttempt: 2, VisibleAfter: time.Now().UTC().Add(time.Hour), LastError: "later"}); err != nil {
				t.Fatal(err)
			}
			return key
		},
		"Fail": failed,
		"Cancel": func() string {
			key := fresh()
			if ok, err := st.Cancel(ctx, outbox.CancelParams{DispatchKey: key, Reason: "test", Now: time.Now().UTC()}); err != nil || !ok {
				t.Fatalf("Cancel: %v %v", ok, err)
			}
			return key
		},
		"RearmStale": func() string {
			key := fresh()
			claimed(key)
			rows, err := st.RearmStale(ctx, outbox.RearmParams{OlderThan: time.Now().UTC().Add(time.Hour), VisibleAfter: time.Now().UTC(), Limit: 1000})
			if err != nil || !slices.ContainsFunc(rows, func(r outbox.Row) bool { return r.DispatchKey == key }) {
				t.Fatalf("RearmStale: %v %v", len(rows), err)
			}
			return key
		},
		"Redrive": func() string {
			key := failed()
			if n, err := st.Redrive(ctx, "ns", []string{key}, time.Now().UTC()); err != nil || n != 1 {
				t.Fatalf("Redrive: %d %v", n, err)
			}
			return key
		},
		"PurgeDeadLetters": func() string {
			key := failed()
			if n, err := st.PurgeDeadLetters(ctx, "ns", []string{key}, time.Now().UTC()); err != nil || n != 1 {
				t.Fatalf("PurgeDeadLetters: %d %v", n, err)
			}
			return key
		},
	}

	typ := reflect.TypeOf(st)
	for i := range typ.NumMethod() {
		name := typ.Method(i).Name
		if slices.Contains(reads, name) || slices.Contains(claims, name) {
			continue
		}
		change, ok := changes[name]
		if !ok {
			t.Errorf("replication.Store.%s is neither a read nor a claim, and no case shows its change reaching the backups: add one", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			key := change()
			mine, err := a.store.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			poll.Eventually(t, 10*time.Second, name+" on the backup", func() (bool, string) {
				theirs, err := b.store.Get(ctx, key)
				if err != nil {
					return false, err.Error()
				}
				same := theirs.Status == mine.Status && theirs.Version == mine.Version
				return same, fmt.Sprintf("backup %s %+v, primary %s %+v", theirs.Status, theirs.Version, mine.Status, mine.Version)
			})
		})
	}
	for name := range changes {
		if _, ok := typ.MethodByName(name); !ok {
			t.Errorf("case %s names no method of replication.Store", name)
		}
	}
}
