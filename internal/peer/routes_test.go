package peer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/lease"
)

// recorder is a Local and a Leases that records each call ("Method
// arg…") and answers what the test set, or err when set.
type recorder struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (r *recorder) record(format string, args ...any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	return r.err
}

func (r *recorder) took() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

var (
	wantRow   = api.Row{DispatchKey: "order/42 ü", Namespace: "tenant.a", Node: "n2"}
	wantPage  = api.RowPage{Rows: []api.Row{wantRow}, Next: "order/43"}
	wantStats = NodeStats{Node: "n2", Namespaces: map[string]api.NodeNamespaceStats{}}
)

func (r *recorder) Row(_ context.Context, key string) (api.Row, error) {
	return wantRow, r.record("Row %s", key)
}
func (r *recorder) DeadLetters(_ context.Context, ns string, q url.Values) (DeadLettersResponse, error) {
	more := true
	return DeadLettersResponse{Rows: []api.Row{wantRow}, More: &more}, r.record("DeadLetters %s %s", ns, q.Encode())
}
func (r *recorder) Redrive(_ context.Context, ns string, keys []string) (int, error) {
	return 3, r.record("Redrive %s %v", ns, keys)
}
func (r *recorder) Purge(_ context.Context, ns string, keys []string) (int, error) {
	return 4, r.record("Purge %s %v", ns, keys)
}
func (r *recorder) Rows(_ context.Context, ns string, q url.Values) (api.RowPage, error) {
	return wantPage, r.record("Rows %s %s", ns, q.Encode())
}
func (r *recorder) Cancel(_ context.Context, req CancelRequest) (api.CancelResult, error) {
	return api.CancelResult{DispatchKey: req.DispatchKey, Cancelled: true}, r.record("Cancel %s %s", req.DispatchKey, req.Reason)
}
func (r *recorder) Stats(context.Context) (NodeStats, error) { return wantStats, r.record("Stats") }
func (r *recorder) HandleLease(req lease.Request) (lease.Response, error) {
	return lease.Response{Epoch: 7, Leases: []lease.Lease{}}, r.record("HandleLease %s", req.Node)
}
func (r *recorder) HandleHandoff(h lease.Handoff) int {
	_ = r.record("HandleHandoff %s", h.From)
	return 0
}
func (r *recorder) CoordinatorStatus(ns string) (lease.NamespaceStatus, bool) {
	_ = r.record("CoordinatorStatus %s", ns)
	return lease.NamespaceStatus{Namespace: ns, Outstanding: 5}, ns != "nobody"
}

// serve mounts NewServer under every pattern of Routes on an outer
// ServeMux, as package httpapi does, recording the pattern each request
// matched there.
func serve(t *testing.T, cfg ServerConfig) (addr string, patterns func() []string) {
	var mu sync.Mutex
	var hits []string
	h := NewServer(cfg)
	mux := http.NewServeMux()
	for _, pattern := range Routes() {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, r.Pattern)
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := hits
		hits = nil
		return out
	}
}

// TestEveryClientCallReachesItsLocalMethod calls each Client method once
// against the real Server: each must match the route its doc names, reach
// the Local or Leases method with the arguments the caller gave (path
// values unescaped, query and body intact), and bring that method's answer
// back; every route must be called by some method. A path, a field or an
// argument changed on one side only fails here.
func TestEveryClientCallReachesItsLocalMethod(t *testing.T) {
	rec := &recorder{}
	addr, patterns := serve(t, ServerConfig{Local: rec, Leases: rec})
	c := NewClient(nil)
	defer c.CloseIdle()
	ctx := context.Background()
	const ns, key = "tenant.a", "order/42 ü"
	dlq := DeadLetterQuery{After: "a", Limit: 2, MaxBytes: 100, WithPayload: true}

	calls := []struct {
		route, want string
		call        func() (got, want any, err error)
	}{
		{RouteRow, "Row " + key, func() (any, any, error) { v, err := c.GetRow(ctx, addr, key); return v, wantRow, err }},
		{RouteDeadLetters, "DeadLetters " + ns + " " + dlq.Values().Encode(), func() (any, any, error) {
			v, err := c.DeadLetters(ctx, addr, ns, dlq)
			return len(v.Rows) == 1 && v.More != nil && *v.More, true, err
		}},
		{RouteRedrive, "Redrive " + ns + " [k1 k2]", func() (any, any, error) {
			v, err := c.Redrive(ctx, addr, ns, DeadLetterKeys{Keys: []string{"k1", "k2"}})
			return v, 3, err
		}},
		{RoutePurge, "Purge " + ns + " []", func() (any, any, error) { v, err := c.Purge(ctx, addr, ns, DeadLetterKeys{}); return v, 4, err }},
		{RouteRows, "Rows " + ns + " limit=1&status=failed", func() (any, any, error) {
			v, err := c.Rows(ctx, addr, ns, url.Values{"limit": {"1"}, "status": {"failed"}})
			return v, wantPage, err
		}},
		{RouteCancel, "Cancel " + key + " why", func() (any, any, error) {
			v, err := c.Cancel(ctx, addr, CancelRequest{DispatchKey: key, Reason: "why"})
			return v, api.CancelResult{DispatchKey: key, Cancelled: true}, err
		}},
		{RouteStats, "Stats", func() (any, any, error) { v, err := c.Stats(ctx, addr); return v, wantStats, err }},
		{RouteLease, "HandleLease n1", func() (any, any, error) {
			v, err := c.Lease(ctx, addr, lease.Request{Node: "n1"})
			return v.Epoch, uint64(7), err
		}},
		{RouteLeaseHandoff, "HandleHandoff n1", func() (any, any, error) {
			return nil, nil, c.LeaseHandoff(ctx, addr, lease.Handoff{From: "n1"})
		}},
		{RouteLeaseStatus, "CoordinatorStatus " + ns, func() (any, any, error) {
			v, err := c.LeaseStatus(ctx, addr, ns)
			return v.Outstanding, uint64(5), err
		}},
	}
	var called []string
	for _, tc := range calls {
		got, want, err := tc.call()
		if err != nil {
			t.Errorf("%s: %v", tc.route, err)
		} else if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: answered %+v, want %+v", tc.route, got, want)
		}
		if p := patterns(); len(p) != 1 || p[0] != tc.route {
			t.Errorf("%s: matched %v, want that route once", tc.route, p)
		}
		if got := rec.took(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: the server called %q, want %q once", tc.route, got, tc.want)
		}
		called = append(called, tc.route)
	}
	for _, r := range Routes() {
		if !slices.Contains(called, r) {
			t.Errorf("route %s has no client call in this test: add one", r)
		}
	}
}

// TestServerRefusals: what a Local refuses comes back to the Client as
// the error it names (ErrNotFound for "not held here", the field of an
// *httperr.Error), a bad namespace or body is refused before Local is
// called, and a node without a lease service answers its lease routes
// 503 and its lease status 404.
func TestServerRefusals(t *testing.T) {
	rec := &recorder{}
	addr, _ := serve(t, ServerConfig{Local: rec})
	c := NewClient(nil)
	defer c.CloseIdle()
	ctx := context.Background()

	rec.err = fmt.Errorf("row k: %w", ErrNotFound)
	if _, err := c.GetRow(ctx, addr, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a row Local does not hold: %v, want ErrNotFound", err)
	}
	rec.err = httperr.Field("keys[0]", "must be 1-3 bytes")
	if _, err := c.Purge(ctx, addr, "ns", DeadLetterKeys{Keys: []string{"long"}}); err == nil ||
		!strings.Contains(err.Error(), "HTTP 400") || !strings.Contains(err.Error(), `"field":"keys[0]"`) {
		t.Errorf("a purge Local refuses: %v, want a 400 naming keys[0]", err)
	}
	rec.err = nil
	rec.took()

	for _, tc := range []struct {
		method, path, body, want string
	}{
		{"GET", "/internal/v1/namespaces/a%20b/rows", "", `"field":"namespace"`},
		{"POST", PathRedrive("ns"), `{"keys":["k"],"extra":1}`, `"code":"invalid_json"`},
		{"POST", PathCancel, `{"dispatch_key":`, `"code":"invalid_json"`},
		{"POST", PathLeases, `{}`, `"code":"unavailable"`},
		{"POST", PathLeaseHandoff, `{}`, `"code":"unavailable"`},
		{"GET", PathLeaseStatus("ns"), "", "not found on peer"},
	} {
		var body []byte
		if tc.body != "" {
			body = []byte(tc.body)
		}
		err := c.CallBody(ctx, tc.method, addr, tc.path, "application/json", body, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s %s: %v, want an error with %s", tc.method, tc.path, tc.body, err, tc.want)
		}
	}
	if got := rec.took(); len(got) != 0 {
		t.Errorf("refused requests reached Local: %q", got)
	}
}
