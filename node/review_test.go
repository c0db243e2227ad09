package node_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/node"
)

// A namespace's retry override replaces the node's policy: with
// max_attempts 1 a retryable 503 dead-letters the row at once, while the
// node default (10 attempts) would keep retrying.
func TestNamespaceRetryOverride(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	tg.SetStatus(http.StatusServiceUnavailable)
	n.setTarget("flaky", "default", tg.URL())
	n.mustDo(http.MethodPut, "/v1/namespaces/flaky", map[string]any{"retry": map[string]any{"max_attempts": 1}}, http.StatusOK, nil)
	var v struct {
		Retry *struct {
			MaxAttempts int `json:"max_attempts"`
		} `json:"retry"`
	}
	n.mustDo(http.MethodGet, "/v1/namespaces/flaky", nil, http.StatusOK, &v)
	if v.Retry == nil || v.Retry.MaxAttempts != 1 {
		t.Fatalf("namespace view retry = %+v, want max_attempts 1", v.Retry)
	}
	n.appendRows(rowIn{"dispatch_key": "flaky-1", "namespace": "flaky"})
	row := n.waitStatus("flaky-1", "failed", 10*time.Second)
	if row.Attempt != 1 || !strings.Contains(row.LastError, "503") {
		t.Fatalf("row = attempt %d last_error %q, want dead letter after attempt 1 with the 503", row.Attempt, row.LastError)
	}
	// null returns the namespace to the node policy.
	n.mustDo(http.MethodPut, "/v1/namespaces/flaky", map[string]any{"retry": nil}, http.StatusOK, nil)
	v.Retry = nil
	n.mustDo(http.MethodGet, "/v1/namespaces/flaky", nil, http.StatusOK, &v)
	if v.Retry != nil {
		t.Fatalf("retry after null = %+v, want none", v.Retry)
	}
}

// Bad input found by review: each is a 400 naming the field, never a 500,
// and nothing is stored or changed.
func TestReviewBadInputs(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	cases := []struct {
		name, method, path string
		body               any
		field              string
	}{
		{"delay_ms that overflows a Duration", http.MethodPost, "/v1/rows",
			map[string]any{"rows": []any{map[string]any{"dispatch_key": "late", "delay_ms": int64(9300000000000)}}}, "rows[0].delay_ms"},
		{"target URL over the config value limit", http.MethodPut, "/v1/namespaces/ns/task-queues/q/target",
			map[string]any{"url": "http://example.com/" + strings.Repeat("a", 1200)}, "url"},
		{"hold of a workflow_id that is not UTF-8", http.MethodPut, "/v1/workflows/%FF%FE/hold", nil, "workflow_id"},
		{"retry factor out of range", http.MethodPut, "/v1/namespaces/ns", map[string]any{"retry": map[string]any{"factor": 50}}, "retry.factor"},
		{"retry cap below base", http.MethodPut, "/v1/namespaces/ns", map[string]any{"retry": map[string]any{"base_ms": 1000, "cap_ms": 10}}, "retry.cap_ms"},
		{"retry with an unknown field", http.MethodPut, "/v1/namespaces/ns", map[string]any{"retry": map[string]any{"bogus": 1}}, "retry"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, b := n.at(t).do(tc.method, tc.path, tc.body)
			wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, tc.field)
		})
	}
	wantNotStored(t, n, "late")
	var v struct {
		Retry any `json:"retry"`
	}
	n.mustDo(http.MethodGet, "/v1/namespaces/ns", nil, http.StatusOK, &v)
	if v.Retry != nil {
		t.Fatalf("a refused retry override was stored: %v", v.Retry)
	}
}

// Slot data dirs (docker compose replicas sharing a volume): two nodes at
// once take different slots, and a node started later in a slot freed by a
// graceful stop (compose recreating a container stops the old one with
// SIGTERM) gets the name bound to it, whatever name it was given. The slot
// rule's other cases (a killed node's slot, a restarted container) are in
// slot_internal_test.go.
func TestSlotDataDirs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	slotted := func(name string) func(*node.Config) {
		return func(c *node.Config) {
			c.DataDir = root + "/{slot}"
			c.NodeName = name
		}
	}
	a := startNode(t, slotted("first"))
	b := startNode(t, slotted("second"))
	if a.Name() != "first" || b.Name() != "second" {
		t.Fatalf("names %q, %q; want first, second", a.Name(), b.Name())
	}
	a.appendRows(rowIn{"dispatch_key": "kept", "namespace": "held"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c := startNode(t, slotted("recreated-container"))
	if c.Name() != "first" {
		t.Fatalf("a node in the freed slot is named %q, want the slot's name first", c.Name())
	}
	if _, ok := c.getRow("kept"); !ok {
		t.Fatal("the slot's rows did not come back with it")
	}
}

// An override that sets only cap_ms below the node's base (or only base_ms
// above its cap) is kept whole: the unset field moves, and max_attempts
// still applies. Found by the second review: the dispatcher used to drop the
// whole override as invalid.
func TestRetryOverrideKeptWhenMergedWithNodePolicy(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil) // node policy: base 500 ms (default)
	tg := newTarget(t)
	tg.SetStatus(http.StatusServiceUnavailable)
	n.setTarget("capped", "default", tg.URL())
	n.mustDo(http.MethodPut, "/v1/namespaces/capped", map[string]any{"retry": map[string]any{"max_attempts": 2, "cap_ms": 10}}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "capped-1", "namespace": "capped"})
	row := n.waitStatus("capped-1", "failed", 10*time.Second)
	if row.Attempt != 2 {
		t.Fatalf("dead-lettered at attempt %d, want 2 (the override's max_attempts)", row.Attempt)
	}
}

// Cancelling Start while it waits to join fails the start: the node never
// owns a shard or reports ready with its solo view. Found by the second
// review.
func TestStartCancelledWhileJoiningFails(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Join = []string{"127.0.0.1:1"} // nobody answers
	cfg.JoinWait = 30 * time.Second
	n, err := node.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = n.Start(ctx)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want the context's error", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Start took %v to notice its context ended", took)
	}
	if n.Ready() {
		t.Fatal("a node whose start was cancelled reports ready")
	}
}
