package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
)

// procStatusKiB reads one "Name: N kB" line of /proc/PID/status.
func procStatusKiB(t *testing.T, pid int, name string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name+":" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("/proc/%d/status %q: %v", pid, line, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, name)
	return 0
}

// rssPeak samples a process's VmRSS and RssAnon every 5 ms until stop is
// called, which returns the peaks in MiB.
func rssPeak(t *testing.T, pid int) (stop func() (rss, anon int)) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var rss, anon int
	sample := func() {
		rss = max(rss, procStatusKiB(t, pid, "VmRSS"))
		anon = max(anon, procStatusKiB(t, pid, "RssAnon"))
	}
	sample()
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				sample()
			}
		}
	})
	return func() (int, int) {
		close(done)
		wg.Wait()
		sample()
		return rss >> 10, anon >> 10
	}
}

type deadLetterPageView struct {
	Rows []struct {
		DispatchKey   string `json:"dispatch_key"`
		Status        string `json:"status"`
		PayloadBase64 string `json:"payload_base64"`
		PayloadBytes  int    `json:"payload_bytes"`
		Node          string `json:"node"`
	} `json:"rows"`
	Next             string   `json:"next"`
	UnreachableNodes []string `json:"unreachable_nodes"`
}

// TestDeadLetterPagesAreBounded: 200 dead letters over 2 nodes. A page of
// GET …/dead-letters?limit=1000 stays within its byte budget (4 MiB of JSON
// rows, plus at most one row) however many rows every node holds, paging
// visits every dead letter once in key order, and include_payload=false
// lists all 200 in one small page with their payload sizes. In the gate
// the payloads are 128 KiB (25 MiB in all, still several pages); with
// FAIRSHARD_LONG=1 they are 1 MiB (200 MiB) and the answering node's
// memory is bounded too (sampled from /proc while the requests run): a
// gather of every node's rows before trimming made a 158 MB answer and
// took the node's RSS from 83 to 831 MB.
func TestDeadLetterPagesAreBounded(t *testing.T) {
	c := newCluster(t, clusterOpts{PlainBuild: true}) // an RSS bound: the production build's
	a := c.startNode("dl-a")
	c.startNode("dl-b")
	c.waitConverged(30 * time.Second)

	reject := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "refused by the test target", http.StatusUnprocessableEntity)
	}))
	defer reject.Close()
	if st, b, err := c.do(http.MethodPut, a.baseURL()+"/v1/namespaces/dl/task-queues/default/target", map[string]any{"url": reject.URL}, nil); err != nil || st != http.StatusOK {
		t.Fatalf("set target: %d %s %v", st, b, err)
	}

	const rows = 200
	payload := 128 << 10
	if long() {
		payload = 1 << 20
	}
	body := make([]byte, payload)
	_, _ = rand.Read(body)
	b64 := base64.StdEncoding.EncodeToString(body)
	var keys []string
	for i := 0; i < rows; i += 6 {
		var batch []map[string]any
		for j := i; j < min(i+6, rows); j++ {
			k := fmt.Sprintf("dl-%04d", j)
			keys = append(keys, k)
			batch = append(batch, map[string]any{"dispatch_key": k, "namespace": "dl", "payload_base64": b64})
		}
		if st, b, err := c.do(http.MethodPost, a.baseURL()+"/v1/rows", map[string]any{"rows": batch}, nil); err != nil || st != http.StatusOK {
			t.Fatalf("append: %d %.300s %v", st, b, err)
		}
	}
	// R = 2 (the default) on 2 nodes: each dead letter is held by both;
	// the pages below list it once, from its shard's primary.
	poll.Eventually(t, deadline(60*time.Second), "200 dead letters, 2 copies each", func() (bool, string) {
		_, _, dead, err := c.backlog("dl")
		return err == nil && dead == 2*rows, fmt.Sprintf("%d dead letter copies (%v)", dead, err)
	})

	page := func(q string) (deadLetterPageView, int) {
		t.Helper()
		var v deadLetterPageView
		st, b, err := c.do(http.MethodGet, a.baseURL()+"/v1/namespaces/dl/dead-letters?"+q, nil, &v)
		if err != nil || st != http.StatusOK {
			t.Fatalf("GET dead-letters?%s: %d %.300s %v", q, st, b, err)
		}
		if len(v.UnreachableNodes) != 0 {
			t.Fatalf("unreachable nodes %v", v.UnreachableNodes)
		}
		return v, len(b)
	}
	pid := a.process().Pid()
	rss0, anon0 := procStatusKiB(t, pid, "VmRSS")>>10, procStatusKiB(t, pid, "RssAnon")>>10

	// The request.
	stop := rssPeak(t, pid)
	v, size := page("limit=1000")
	rss1, anon1 := stop()
	t.Logf("limit=1000: %d rows, %d bytes; answering node RSS %d → peak %d MiB (anon %d → %d)", len(v.Rows), size, rss0, rss1, anon0, anon1)
	const budget = 4 << 20
	oneRow := base64.StdEncoding.EncodedLen(payload) + 1024
	if len(v.Rows) == 0 || size > budget+oneRow || v.Next == "" {
		t.Fatalf("first page: %d rows, %d bytes, next %q; want rows within %d bytes and a next page", len(v.Rows), size, v.Next, budget+oneRow)
	}
	if long() && (rss1-rss0 > 64 || anon1-anon0 > 48) {
		t.Errorf("one page raised the answering node's RSS by %d MiB (anon %d MiB); want ≤ 64 (anon ≤ 48)", rss1-rss0, anon1-anon0)
	}

	// Every page, to the end.
	stop = rssPeak(t, pid)
	var listed []string
	pages, biggest := 0, 0
	for after := ""; ; {
		v, size := page("limit=1000&after=" + url.QueryEscape(after))
		pages++
		biggest = max(biggest, size)
		for _, r := range v.Rows {
			listed = append(listed, r.DispatchKey)
			if r.Status != "failed" || len(r.PayloadBase64) != base64.StdEncoding.EncodedLen(payload) {
				t.Fatalf("dead letter %s: status %s, %d base64 bytes", r.DispatchKey, r.Status, len(r.PayloadBase64))
			}
		}
		if v.Next == "" {
			break
		}
		after = v.Next
		if pages > rows {
			t.Fatal("more pages than rows")
		}
	}
	rss2, anon2 := stop()
	t.Logf("all pages: %d pages, largest %d bytes; answering node RSS peak %d MiB (anon %d)", pages, biggest, rss2, anon2)
	if fmt.Sprint(listed) != fmt.Sprint(keys) {
		t.Fatalf("paging listed %d keys, want the %d dead letters once each in key order", len(listed), len(keys))
	}
	if biggest > budget+oneRow {
		t.Errorf("a page of %d bytes, budget %d", biggest, budget)
	}
	if long() && (rss2-rss0 > 160 || anon2-anon0 > 48) {
		t.Errorf("paging through %d MiB of dead letters raised the answering node's RSS by %d MiB (anon %d MiB); want ≤ 160 (the data file's mapped pages) and anon ≤ 48", rows*payload>>20, rss2-rss0, anon2-anon0)
	}

	// Without payloads: one page, every row, with its payload's size.
	v, size = page("limit=1000&include_payload=false")
	if len(v.Rows) != rows || v.Next != "" || size > 256<<10 {
		t.Fatalf("include_payload=false: %d rows, next %q, %d bytes", len(v.Rows), v.Next, size)
	}
	for _, r := range v.Rows {
		if r.PayloadBase64 != "" || r.PayloadBytes != payload {
			t.Fatalf("row %s without payload: %d base64 bytes, payload_bytes %d", r.DispatchKey, len(r.PayloadBase64), r.PayloadBytes)
		}
	}
	// A small budget still makes progress: one row a page.
	if v, _ := page("limit=1000&max_bytes=1"); len(v.Rows) != 1 || v.Next != keys[0] {
		t.Fatalf("max_bytes=1: %d rows, next %q", len(v.Rows), v.Next)
	}
	for _, q := range []string{"max_bytes=0", "max_bytes=x", fmt.Sprintf("max_bytes=%d", 16<<20+1), "include_payload=maybe"} {
		st, b, _ := c.do(http.MethodGet, a.baseURL()+"/v1/namespaces/dl/dead-letters?"+q, nil, nil)
		var e struct {
			Error struct {
				Field string `json:"field"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if st != http.StatusBadRequest || !strings.HasPrefix(q, e.Error.Field+"=") {
			t.Errorf("?%s: %d %s, want 400 naming the field", q, st, b)
		}
	}
}
