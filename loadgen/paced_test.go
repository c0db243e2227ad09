package loadgen

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/client"
)

// ledgerNode answers POST /v1/rows like a fairshard node, each row
// "created" on shard 7 by node "fake", except that it answers *status
// while that is non-zero. A fake: a real node cannot be made to refuse
// appends on demand.
func ledgerNode(t *testing.T, status *atomic.Int32, requests *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The answer is decided before the request is counted: a test that
		// changes status once it has counted n requests knows those n
		// were answered with the old one.
		s := status.Load()
		requests.Add(1)
		var req struct {
			Rows []struct {
				DispatchKey string `json:"dispatch_key"`
			} `json:"rows"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if s != 0 {
			http.Error(w, `{"error":{"code":"unavailable","message":"refused on purpose"}}`, int(s))
			return
		}
		out := make([]client.AppendResult, len(req.Rows))
		for i, row := range req.Rows {
			out[i] = client.AppendResult{DispatchKey: row.DispatchKey, Status: client.Created, Shard: 7, Node: "fake"}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"rows": out})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A paced load makes rows of each namespace at its own rate in bursts,
// through the nodes NodesNow names, and its ledger holds every row's
// fate: the failed attempts on a refusing node, then the answer of the
// healthy one. SetRateFactor(0) stops making rows; Stop ends the run once
// every row made is acknowledged.
func TestPacedLoadLedgersEveryRow(t *testing.T) {
	var down, up atomic.Int32
	down.Store(http.StatusServiceUnavailable)
	var downReqs, upReqs atomic.Int64
	bad, good := ledgerNode(t, &down, &downReqs), ledgerNode(t, &up, &upReqs)
	start := time.Now()
	led := NewLedger(start)
	g, err := NewGenerator(Config{
		NodesNow:    func() []string { return []string{bad.URL, good.URL} },
		Namespaces:  []Namespace{{Name: "big", Rate: 400, TaskQueues: 3}, {Name: "small", Rate: 40}},
		Bursts:      Bursts{Low: 0.2, High: 2, Min: 50 * time.Millisecond, Max: 150 * time.Millisecond},
		Seed:        7,
		BatchSize:   20,
		Concurrency: 3,
		Key:         func(ns string, n int64) string { return ns + "-" + strconv.FormatInt(n, 10) },
		Retry:       client.RetryConfig{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		KeepTrying:  true,
		Ledger:      led,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Report, 1)
	go func() {
		rep, _ := g.Run(context.Background())
		done <- rep
	}()
	time.Sleep(600 * time.Millisecond)
	g.SetRateFactor(0)
	time.Sleep(100 * time.Millisecond) // a tick in flight may still make a row
	made, _, _ := led.Progress()
	time.Sleep(200 * time.Millisecond)
	if again, _, _ := led.Progress(); again != made {
		t.Errorf("rows made went from %d to %d at rate factor 0", made, again)
	}
	g.Stop()
	var rep Report
	select {
	case rep = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10 s after Stop")
	}

	rows := led.Rows()
	made, acked, batches := led.Progress()
	if made != len(rows) || acked != made || made < 50 || batches == 0 || rep.Appended != int64(made) || rep.GaveUp != 0 {
		t.Fatalf("made %d (ledger rows %d), acknowledged %d in %d batches, report appended %d gave up %d; want every row of at least 50 acknowledged",
			made, len(rows), acked, batches, rep.Appended, rep.GaveUp)
	}
	perNS := [2]int{}
	for seq, r := range rows {
		if r.Tries < 1 || r.Status != client.Created || r.Node != "fake" || r.Shard != 7 || r.Acked < r.Sent || r.Sent <= 0 {
			t.Fatalf("row %d: %+v; want tried, created on shard 7 by fake, acknowledged after it was sent", seq, r)
		}
		perNS[r.Namespace]++
	}
	if perNS[0] <= perNS[1] || perNS[1] == 0 {
		t.Errorf("rows per namespace %v: want both, more of the faster", perNS)
	}
	fails := led.FailedAttempts()
	if len(fails) == 0 {
		t.Fatal("no failed attempt recorded, yet every append tried the refusing node in turn")
	}
	for seq, fs := range fails {
		if len(fs) > MaxFailedAttemptsKept || rows[seq].Failed < len(fs) || fs[0].Node != bad.URL || !strings.Contains(fs[0].Err, "refused on purpose") {
			t.Fatalf("row %d: failed attempts %+v of %d; want at most %d, on %s, with its error", seq, fs, rows[seq].Failed, MaxFailedAttemptsKept, bad.URL)
		}
	}
	classes, refusals := led.Errors()
	if classes["HTTP 503"] == 0 || len(refusals) != 0 {
		t.Errorf("error classes %v, refusals %v; want 503s and no refusal", classes, refusals)
	}
}

// KeepTrying sends a batch again until a node takes it; a refusal (bad
// input) is recorded and not retried.
func TestKeepTryingUntilAcknowledgedOrRefused(t *testing.T) {
	var status atomic.Int32
	var reqs atomic.Int64
	status.Store(http.StatusServiceUnavailable)
	node := ledgerNode(t, &status, &reqs)
	led := NewLedger(time.Now())
	g, err := NewGenerator(Config{Nodes: []string{node.URL}, Rows: 10, BatchSize: 10, Concurrency: 1, KeepTrying: true, Ledger: led,
		Retry: client.RetryConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for reqs.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		status.Store(0)
	}()
	rep, err := g.Run(context.Background())
	if err != nil || rep.Appended != 10 || rep.GaveUp != 0 {
		t.Fatalf("report %+v, %v; want 10 rows appended after the node recovered", rep, err)
	}
	if r := led.Rows()[0]; r.Tries < 4 || r.Failed != r.Tries-1 || r.Status != client.Created {
		t.Errorf("row 0: %+v; want at least 3 failed tries, then created", r)
	}

	status.Store(http.StatusBadRequest)
	led = NewLedger(time.Now())
	g, err = NewGenerator(Config{Nodes: []string{node.URL}, Rows: 5, BatchSize: 5, Concurrency: 1, KeepTrying: true, Ledger: led})
	if err != nil {
		t.Fatal(err)
	}
	before := reqs.Load()
	rep, _ = g.Run(context.Background())
	if _, refusals := led.Errors(); rep.Appended != 0 || rep.GaveUp != 5 || reqs.Load()-before != 1 || len(refusals) != 1 {
		t.Errorf("report %+v after %d requests, refusals %v; want one request, its 5 rows given up and one refusal", rep, reqs.Load()-before, refusals)
	}
}
