package loadgen

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/client"
)

// fakeNode answers POST /v1/rows like a fairshard node ("created" for
// every row), or with status when it is non-zero. A fake: a real node
// cannot be made to refuse every append on demand.
func fakeNode(t *testing.T, status int, seen *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Rows []struct {
				DispatchKey string `json:"dispatch_key"`
			} `json:"rows"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if status != 0 {
			http.Error(w, `{"error":{"code":"unavailable","message":"draining"}}`, status)
			return
		}
		seen.Add(int64(len(req.Rows)))
		type res struct {
			Status string `json:"status"`
		}
		out := make([]res, len(req.Rows))
		for i := range out {
			out[i].Status = "created"
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"rows": out})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A node that refuses appends (draining, down) costs no rows: each failed
// batch is retried on another node.
func TestGeneratorRetriesFailedBatchOnNextNode(t *testing.T) {
	var okRows, badRows atomic.Int64
	bad := fakeNode(t, http.StatusServiceUnavailable, &badRows)
	good := fakeNode(t, 0, &okRows)

	var mu sync.Mutex
	keys := map[string]string{}
	failed := map[string]int{}
	g, err := NewGenerator(Config{
		Nodes:       []string{bad.URL, good.URL},
		Rows:        1000,
		BatchSize:   50,
		Concurrency: 2,
		KeyPrefix:   "k-",
		OnAppended: func(key, _, status string) {
			mu.Lock()
			keys[key] = status
			mu.Unlock()
		},
		OnFailed: func(node string, batch []string, err error) {
			if node != bad.URL || err == nil || len(batch) != 50 {
				t.Errorf("OnFailed(%s, %d keys, %v); want the refusing node, a batch of 50 and its error", node, len(batch), err)
			}
			mu.Lock()
			for _, k := range batch {
				failed[k]++
			}
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := g.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 1000 || okRows.Load() != 1000 || len(keys) != 1000 {
		t.Fatalf("appended %d, node stored %d, acknowledged keys %d; want 1000 each", rep.Appended, okRows.Load(), len(keys))
	}
	if rep.GaveUp != 0 || g.GaveUp() != 0 {
		t.Fatalf("gave up %d rows; want 0 (the retry goes to the healthy node)", rep.GaveUp)
	}
	if rep.Errors == 0 || int(rep.Errors)*50 != len(failed) {
		t.Fatalf("%d request errors counted, OnFailed saw %d keys; want errors > 0 and 50 keys each", rep.Errors, len(failed))
	}
	for k := range failed {
		if _, ok := keys[k]; !ok {
			t.Fatalf("key %s failed once and was never acknowledged by the retry", k)
		}
	}
}

// A batch refused by every node on every attempt is given up and counted.
func TestGeneratorCountsGivenUpRows(t *testing.T) {
	var n atomic.Int64
	bad := fakeNode(t, http.StatusServiceUnavailable, &n)
	g, err := NewGenerator(Config{Nodes: []string{bad.URL}, Rows: 30, BatchSize: 10, Concurrency: 1,
		Retry: client.RetryConfig{MaxAttempts: 2, BaseDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := g.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 0 || rep.GaveUp != 30 || rep.Errors != 6 || !strings.Contains(g.LastError(), "unavailable") {
		t.Fatalf("appended %d, gave up %d, errors %d (last %q); want 0, 30, 6 (2 attempts of 3 batches), a 503", rep.Appended, rep.GaveUp, rep.Errors, g.LastError())
	}
}
