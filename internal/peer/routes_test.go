package peer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fairshard/fairshard/lease"
)

// TestEveryClientCallHitsItsRoute serves every pattern of Routes on a real
// ServeMux (the way package httpapi registers them) and calls each Client
// method once: each must reach the route its doc names, with the path
// values the server reads, and every route must be called by some method.
// A path changed on one side only fails here.
func TestEveryClientCallHitsItsRoute(t *testing.T) {
	var mu sync.Mutex
	hits := map[string][]string{} // pattern -> "ns=…,key=…" of each call
	mux := http.NewServeMux()
	for _, pattern := range Routes() {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits[r.Pattern] = append(hits[r.Pattern], "ns="+r.PathValue("ns")+",key="+r.PathValue("key"))
			mu.Unlock()
			http.Error(w, "recorded", http.StatusNotFound) // every call returns ErrNotFound
		})
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := NewClient(nil)
	defer c.CloseIdle()
	ctx := context.Background()
	const ns, key = "tenant.a", "order/42 ü"

	calls := []struct {
		route string
		want  string
		call  func() error
	}{
		{RouteRow, "ns=,key=" + key, func() error { _, err := c.GetRow(ctx, addr, key); return err }},
		{RouteDeadLetters, "ns=" + ns + ",key=", func() error {
			_, err := c.DeadLetters(ctx, addr, ns, DeadLetterQuery{Limit: 1, MaxBytes: 1})
			return err
		}},
		{RouteRedrive, "ns=" + ns + ",key=", func() error { _, err := c.Redrive(ctx, addr, ns, DeadLetterKeys{}); return err }},
		{RoutePurge, "ns=" + ns + ",key=", func() error { _, err := c.Purge(ctx, addr, ns, DeadLetterKeys{}); return err }},
		{RouteRows, "ns=" + ns + ",key=", func() error { _, err := c.Rows(ctx, addr, ns, url.Values{"limit": {"1"}}); return err }},
		{RouteCancel, "ns=,key=", func() error { _, err := c.Cancel(ctx, addr, CancelRequest{DispatchKey: key}); return err }},
		{RouteStats, "ns=,key=", func() error { _, err := c.Stats(ctx, addr); return err }},
		{RouteLease, "ns=,key=", func() error { _, err := c.Lease(ctx, addr, lease.Request{Node: "n1"}); return err }},
		{RouteLeaseHandoff, "ns=,key=", func() error { return c.LeaseHandoff(ctx, addr, lease.Handoff{From: "n1"}) }},
		{RouteLeaseStatus, "ns=" + ns + ",key=", func() error { _, err := c.LeaseStatus(ctx, addr, ns); return err }},
	}
	var called []string
	for _, tc := range calls {
		if err := tc.call(); err == nil || !strings.Contains(err.Error(), "not found on peer") {
			t.Errorf("%s: the call returned %v, want the route's 404 (did it reach the server?)", tc.route, err)
		}
		mu.Lock()
		got := hits[tc.route]
		mu.Unlock()
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: hit %d times with %v, want once with %q", tc.route, len(got), got, tc.want)
		}
		called = append(called, tc.route)
	}
	for _, r := range Routes() {
		if !slices.Contains(called, r) {
			t.Errorf("route %s has no client call in this test: add one", r)
		}
	}
}
