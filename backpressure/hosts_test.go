package backpressure_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/shards"
)

// fakeHosts is a HostSlots whose routes, limits and in-flight counts the
// test sets (the real one, dispatch.HostLimits, measures them; here the
// planner's arithmetic is under test).
type fakeHosts struct {
	mu       sync.Mutex
	hostOf   map[string]string         // namespace or namespace/task_queue → host
	limit    map[string]int            // host → limit
	inflight map[string]map[string]int // host → namespace → rows
	usages   int                       // HostUsage calls
}

func newFakeHosts() *fakeHosts {
	return &fakeHosts{hostOf: map[string]string{}, limit: map[string]int{}, inflight: map[string]map[string]int{}}
}

func (f *fakeHosts) HostOf(r outbox.ClaimScope) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.hostOf[r.Namespace+"/"+r.TaskQueue]; ok {
		return h, h != ""
	}
	h, ok := f.hostOf[r.Namespace]
	return h, ok && h != ""
}

func (f *fakeHosts) HostUsage(h string) backpressure.HostUsage {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.usages++
	u := backpressure.HostUsage{Limit: f.limit[h], ByNamespace: maps.Clone(f.inflight[h])}
	for _, n := range u.ByNamespace {
		u.InFlight += n
	}
	return u
}

// hold records rows as in flight to their hosts (what the dispatcher
// does when it launches them).
func (f *fakeHosts) hold(rows []outbox.Row) {
	for _, r := range rows {
		h, ok := f.HostOf(r.Route())
		if !ok {
			continue
		}
		f.mu.Lock()
		if f.inflight[h] == nil {
			f.inflight[h] = map[string]int{}
		}
		f.inflight[h][r.Namespace]++
		f.mu.Unlock()
	}
}

func (f *fakeHosts) setInFlight(host, ns string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight[host] == nil {
		f.inflight[host] = map[string]int{}
	}
	f.inflight[host][ns] = n
}

// hostSetup is setup with a host ceiling.
func hostSetup(t *testing.T) (*backpressure.Planner, *bundle, *fakeHosts) {
	t.Helper()
	b := &bundle{mem: memstore.New(64), quotas: map[string]uint32{}}
	b.store = &countingStore{Store: b.mem}
	all := shards.OwnAll()
	b.owned.Store(&all)
	hosts := newFakeHosts()
	p := backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(quota.NewPolicies(quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
			q, ok := b.quotas[ns]
			return quota.Settings{MaxInFlight: &q}, ok, nil
		}), quota.Defaults{Quota: quota.DefaultQuota, Mode: quota.ModeProportional}, 0),
			func() shards.OwnedShardFraction { return *b.owned.Load() }),
		Claimed: quota.CountFunc(b.store.CountClaimedByNamespace),
		Now:     func() time.Time { return outboxtest.T0 },
		Hosts:   hosts,
	})
	return p, b, hosts
}

func perRoute(rows []outbox.Row) map[string]int {
	m := map[string]int{}
	for _, r := range rows {
		m[r.Namespace+"/"+r.TaskQueue]++
	}
	return m
}

func nsReport(s backpressure.Sweep, ns string) backpressure.NamespaceSweep {
	for _, n := range s.Namespaces {
		if n.Namespace == ns {
			return n
		}
	}
	return backpressure.NamespaceSweep{}
}

// TestHostCeiling: the host's slots as a second ceiling beside the
// namespace's, shared fairly, one scenario per case.
func TestHostCeiling(t *testing.T) {
	cases := []struct {
		name     string
		limit    int
		inflight map[string]int // namespace → rows in flight to the host
		rows     map[string]int // namespace/task_queue → pending rows
		quotas   map[string]uint32
		batch    int
		want     map[string]int // namespace → claimed
		limited  []string       // namespaces reported HostLimited
	}{
		{name: "host limit caps a lone namespace", limit: 8,
			rows: map[string]int{"noisy/q0": 100, "noisy/q1": 100}, want: map[string]int{"noisy": 8}, limited: []string{"noisy"}},
		{name: "free slots are shared fairly between namespaces", limit: 8,
			rows: map[string]int{"noisy/q0": 100, "noisy/q1": 100, "noisy/q2": 100, "noisy/q3": 100, "quiet/q": 100},
			want: map[string]int{"noisy": 4, "quiet": 4}, limited: []string{"noisy", "quiet"}},
		{name: "a quiet row goes out while a noisy namespace fills the host", limit: 8, inflight: map[string]int{"noisy": 8},
			rows: map[string]int{"noisy/q0": 100, "quiet/q": 1}, want: map[string]int{"quiet": 1}, limited: []string{"noisy"}},
		{name: "a quiet namespace bursts up to its share, not past it", limit: 8, inflight: map[string]int{"noisy": 8},
			rows: map[string]int{"noisy/q0": 100, "quiet/q": 100}, want: map[string]int{"quiet": 4}, limited: []string{"noisy", "quiet"}},
		{name: "a namespace over its share gets free slots only", limit: 8, inflight: map[string]int{"noisy": 6, "quiet": 1},
			rows: map[string]int{"noisy/q0": 100, "quiet/q": 100}, want: map[string]int{"quiet": 3}, limited: []string{"noisy", "quiet"}},
		{name: "free slots a namespace cannot use go to the others", limit: 8,
			rows: map[string]int{"noisy/q0": 100, "quiet/q": 1}, want: map[string]int{"noisy": 7, "quiet": 1}, limited: []string{"noisy"}},
		{name: "a namespace with rows in flight only still holds its share", limit: 8, inflight: map[string]int{"quiet": 2},
			rows: map[string]int{"noisy/q0": 100}, want: map[string]int{"noisy": 6}, limited: []string{"noisy"}},
		{name: "bursts never take a host past twice its limit", limit: 2, inflight: map[string]int{"noisy": 3},
			rows: map[string]int{"noisy/q": 9, "a/q": 1, "b/q": 1, "c/q": 1, "d/q": 1},
			want: map[string]int{"a": 1}, limited: []string{"a", "b", "c", "d", "noisy"}},
		{name: "namespace ceiling and host ceiling both apply", limit: 8, quotas: map[string]uint32{"capped": 3},
			rows: map[string]int{"capped/q": 100, "free/q": 100}, want: map[string]int{"capped": 3, "free": 5}, limited: []string{"free"}},
		{name: "a namespace at its ceiling does not dilute the host's share", limit: 8, quotas: map[string]uint32{"capped": 0},
			rows: map[string]int{"capped/q": 100, "free/q": 100}, want: map[string]int{"free": 8}, limited: []string{"free"}},
		{name: "the batch budget still bounds the sweep", limit: 64, batch: 10,
			rows: map[string]int{"a/q": 100, "b/q": 100}, want: map[string]int{"a": 5, "b": 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, b, hosts := hostSetup(t)
			maps.Copy(b.quotas, tc.quotas)
			hosts.limit["h"] = tc.limit
			for ns, n := range tc.inflight {
				hosts.setInFlight("h", ns, n)
			}
			for route, n := range tc.rows {
				ns, tq, _ := strings.Cut(route, "/")
				hosts.hostOf[ns] = "h"
				b.add(t, ns, tq, n)
			}
			batch := tc.batch
			batch = cmp.Or(batch, 256)
			s := sweep(t, p, b, batch, nil)
			got := perNamespace(s.Rows)
			if !maps.Equal(got, tc.want) {
				t.Fatalf("claimed %v, want %v", got, tc.want)
			}
			var limited []string
			for _, n := range s.Namespaces {
				if n.HostLimited {
					limited = append(limited, n.Namespace)
				}
			}
			if fmt.Sprint(limited) != fmt.Sprint(tc.limited) {
				t.Errorf("HostLimited namespaces %v, want %v", limited, tc.limited)
			}
			if len(s.Hosts) != 1 || s.Hosts[0].Host != "h" || s.Hosts[0].Claimed != len(s.Rows) || s.Hosts[0].Limit != tc.limit {
				t.Errorf("host report %+v, want host h, limit %d, claimed %d", s.Hosts, tc.limit, len(s.Rows))
			}
		})
	}
}

// A noisy namespace spread over task queues shares a host's few slots
// over its routes: with one slot per sweep, the task queues take turns.
func TestHostSlotsRotateOverTaskQueues(t *testing.T) {
	p, b, hosts := hostSetup(t)
	hosts.limit["h"] = 1
	hosts.hostOf["noisy"] = "h"
	for q := range 3 {
		b.add(t, "noisy", fmt.Sprintf("q%d", q), 10)
	}
	var order []string
	for range 6 {
		s := sweep(t, p, b, 256, nil)
		if len(s.Rows) != 1 {
			t.Fatalf("claimed %d rows, want the host's one slot", len(s.Rows))
		}
		order = append(order, s.Rows[0].TaskQueue)
		b.complete(t, s.Rows) // the delivery finished: the slot is free again
	}
	if got := fmt.Sprint(order); got != "[q0 q1 q2 q0 q1 q2]" {
		t.Fatalf("task queues served %s, want them in turn", got)
	}
}

// Hosts are independent ceilings, and a route without a host has none.
func TestHostsAreIndependent(t *testing.T) {
	p, b, hosts := hostSetup(t)
	hosts.limit["full"], hosts.limit["idle"] = 2, 3
	hosts.setInFlight("full", "a", 2)
	hosts.hostOf["a/slow"] = "full"
	hosts.hostOf["a/fast"] = "idle"
	hosts.hostOf["b"] = "" // no host ceiling
	b.add(t, "a", "slow", 10)
	b.add(t, "a", "fast", 10)
	b.add(t, "b", "q", 10)
	s := sweep(t, p, b, 256, nil)
	if got := perRoute(s.Rows); !maps.Equal(got, map[string]int{"a/fast": 3, "b/q": 10}) {
		t.Fatalf("claimed %v, want a/fast:3 (its host's limit), b/q:10 (no host), a/slow:0 (host full)", got)
	}
	if len(s.Hosts) != 2 || !s.Hosts[0].Full() || !s.Hosts[1].Full() {
		t.Fatalf("hosts %+v, want both reported full", s.Hosts)
	}
	if hosts.usages != 2 {
		t.Fatalf("HostUsage called %d times, want once per host", hosts.usages)
	}
}

// A sweep that claims through the host ceiling and then drains keeps
// every row claimed exactly once, and the host never has more than its
// limit in flight when only one namespace wants it.
func TestHostCeilingDrainsEachRowOnce(t *testing.T) {
	p, b, hosts := hostSetup(t)
	hosts.limit["h"] = 5
	hosts.hostOf["a"] = "h"
	want := b.add(t, "a", "q", 37)
	seen := map[string]int{}
	for i := 0; len(seen) < len(want); i++ {
		if i > 100 {
			t.Fatalf("not drained after %d sweeps", i)
		}
		s := sweep(t, p, b, 256, nil)
		if len(s.Rows) > 5 {
			t.Fatalf("sweep %d claimed %d rows, over the host limit 5", i, len(s.Rows))
		}
		for _, r := range s.Rows {
			seen[r.DispatchKey]++
		}
		b.complete(t, s.Rows)
	}
	for _, k := range want {
		if seen[k] != 1 {
			t.Fatalf("row %s claimed %d times", k, seen[k])
		}
	}
}

// TestHostCeilingProperties: random namespaces, routes, hosts, limits and
// rows in flight. Whatever the draw:
//   - no host goes past twice its limit in flight (or, when it was already
//     past that, gets nothing more);
//   - past the limit, only namespaces below their share claimed, and each
//     at most up to its share;
//   - utilisation: with batch budget and namespace headroom left, no route
//     with rows left stops while its host still has a free slot;
//   - fairness: on a host nothing was in flight to, every namespace that
//     wanted only that host got at least min(its rows, its share, the
//     batch slice).
func TestHostCeilingProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p, b, hosts := hostSetup(t)
		nHosts := rapid.IntRange(1, 3).Draw(rt, "hosts")
		hostName := func(i int) string { return fmt.Sprintf("h%d", i) }
		idle := map[string]bool{}
		for h := range nHosts {
			hosts.limit[hostName(h)] = rapid.IntRange(1, 10).Draw(rt, "limit")
			idle[hostName(h)] = rapid.Bool().Draw(rt, "idle")
		}
		nsCount := rapid.IntRange(1, 5).Draw(rt, "namespaces")
		avail := map[string]int{} // namespace/task_queue → rows
		nsHosts := map[string]map[string]bool{}
		for i := range nsCount {
			ns := fmt.Sprintf("ns%d", i)
			nsHosts[ns] = map[string]bool{}
			if rapid.Bool().Draw(rt, "hasQuota") {
				b.quotas[ns] = rapid.Uint32Range(0, 20).Draw(rt, "quota")
			}
			for q := range rapid.IntRange(1, 3).Draw(rt, "routes") {
				tq := fmt.Sprintf("q%d", q)
				h := rapid.IntRange(-1, nHosts-1).Draw(rt, "host") // -1: no host ceiling
				if h >= 0 {
					hosts.hostOf[ns+"/"+tq] = hostName(h)
					nsHosts[ns][hostName(h)] = true
					if !idle[hostName(h)] {
						hosts.setInFlight(hostName(h), ns, rapid.IntRange(0, 12).Draw(rt, "inflight"))
					}
				} else {
					hosts.hostOf[ns+"/"+tq] = ""
					nsHosts[ns]["-"] = true
				}
				n := rapid.IntRange(1, 15).Draw(rt, "rows")
				b.add(t, ns, tq, n)
				avail[ns+"/"+tq] = n
			}
		}
		batch := rapid.IntRange(1, 64).Draw(rt, "batch")
		before := map[string]backpressure.HostUsage{}
		for h := range nHosts {
			before[hostName(h)] = hosts.HostUsage(hostName(h))
		}
		s, err := p.Sweep(ctx, b.store, backpressure.SweepRequest{Batch: batch})
		if err != nil {
			rt.Fatal(err)
		}
		got := perRoute(s.Rows)
		claimedAt := map[string]map[string]int{} // host → namespace → claimed
		for _, r := range s.Rows {
			if h, ok := hosts.HostOf(r.Route()); ok {
				if claimedAt[h] == nil {
					claimedAt[h] = map[string]int{}
				}
				claimedAt[h][r.Namespace]++
			}
		}
		for _, hs := range s.Hosts {
			u := before[hs.Host]
			after := u.InFlight + hs.Claimed
			if hs.Claimed > 0 && after > 2*hs.Limit {
				rt.Fatalf("host %s: %d in flight after the sweep, past twice its limit %d", hs.Host, after, hs.Limit)
			}
			if after > hs.Limit {
				for ns, c := range claimedAt[hs.Host] {
					if c > max(hs.Share-u.ByNamespace[ns], 0)+max(hs.Limit-u.InFlight, 0) {
						rt.Fatalf("host %s over its limit (%d > %d): %s claimed %d with %d in flight, past its share %d plus the free slots",
							hs.Host, after, hs.Limit, ns, c, u.ByNamespace[ns], hs.Share)
					}
				}
			}
		}
		budgetLeft := len(s.Rows) < batch
		for route, n := range avail {
			ns, tq, _ := strings.Cut(route, "/")
			nsw := nsReport(s, ns)
			h, gated := hosts.HostOf(outbox.ClaimScope{Namespace: ns, TaskQueue: tq})
			hostFree := true
			if gated {
				for _, hs := range s.Hosts {
					if hs.Host == h && hs.Full() {
						hostFree = false
					}
				}
			}
			if budgetLeft && nsw.Headroom() > 0 && got[route] < n && hostFree {
				rt.Fatalf("%s: budget, headroom and a free host slot left, but claimed only %d of %d", route, got[route], n)
			}
		}
		slice := (batch + nsCount - 1) / nsCount
		for ns, hs := range nsHosts {
			if len(hs) != 1 {
				continue
			}
			var h string
			for h = range hs {
			}
			if h == "-" || !idle[h] || batch%nsCount != 0 {
				continue
			}
			share, crowded := 0, false
			for _, rep := range s.Hosts {
				if rep.Host == h {
					share, crowded = rep.Share, rep.Namespaces > rep.Limit
				}
			}
			if crowded { // shares of 1 each can reach the 2 × limit bound
				continue
			}
			rows := 0
			for route, n := range avail {
				if strings.HasPrefix(route, ns+"/") {
					rows += n
				}
			}
			nsw := nsReport(s, ns)
			floor := min(rows, share, slice, int(nsw.Ceiling))
			if nsw.Claimed < floor {
				rt.Fatalf("%s on idle host %s: claimed %d < min(rows %d, share %d, slice %d, ceiling %d)", ns, h, nsw.Claimed, rows, share, slice, nsw.Ceiling)
			}
		}
	})
}
