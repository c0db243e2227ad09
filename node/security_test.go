package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
)

// TestSlowBodyDoesNotHoldShutdown: a client that sends an append's
// headers and then its body slowly must not hold a graceful stop (an
// append reading its body does not hold the intake gate the stop's final
// hand-off waits for). The test waits for the server's "100 Continue"
// (the handler is reading the body), sends part of the body and keeps the
// connection open, then stops the node: the stop ends without error
// within the grace and every row is handed off. The grace is a minute: a
// stop held by the client would run it out (and fail), while a loaded
// machine's leave broadcast (seconds) stays well inside it.
func TestSlowBodyDoesNotHoldShutdown(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	pause(t, nodes, "slow")
	var rows []rowIn
	for i := range 1000 {
		rows = append(rows, rowIn{"dispatch_key": fmt.Sprintf("slow-%04d", i), "namespace": "slow"})
	}
	a.appendRows(rows...)
	held := b.namespace("slow").Pending
	if held == 0 {
		t.Fatalf("%s holds none of the 1000 rows", b.Name())
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(b.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/rows HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n", strings.TrimPrefix(b.base, "http://"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, "100") {
		t.Fatalf("waiting for 100 Continue: %q %v", line, err)
	}
	fmt.Fprint(conn, `{"rows":[{"dispatch_key":"never-finished",`) // and nothing more

	const grace = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	start := time.Now()
	err = b.Shutdown(ctx)
	took := time.Since(start)
	if err != nil {
		t.Errorf("Shutdown of %s with a slow client: %v (after %v)", b.Name(), err, took)
	}
	stats, serr := openStore(t, b.cfg.DataDir).NamespaceStats(context.Background())
	if serr != nil {
		t.Fatal(serr)
	}
	if st := stats["slow"]; st.Pending+st.Claimed != 0 {
		t.Errorf("a slow client left %d of %d rows on %s after a %v graceful stop", st.Pending+st.Claimed, held, b.Name(), grace)
	}
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s to hold all 1000 rows", a.Name()), func() (bool, string) {
		return a.namespace("slow").Pending == 1000, fmt.Sprintf("has %d", a.namespace("slow").Pending)
	})
}

// TestServerLimits: the API server closes a connection whose headers
// never finish (ReadHeaderTimeout) and bounds idle and header sizes; the
// values are the documented ones.
func TestServerLimits(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	// Headers over MaxHeaderBytes are refused (431).
	req, _ := http.NewRequest("GET", n.base+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", node.HTTPMaxHeaderBytes+4096))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d-byte header: status %d, want 431", node.HTTPMaxHeaderBytes+4096, resp.StatusCode)
	}
	d := node.DefaultConfig()
	if d.HTTPReadTimeout != time.Minute || d.HTTPIdleTimeout != 2*time.Minute || node.HTTPReadHeaderTimeout <= 0 || node.HTTPWriteTimeout <= 0 {
		t.Errorf("server timeouts differ from the documented ones: read %v, idle %v", d.HTTPReadTimeout, d.HTTPIdleTimeout)
	}
}

// TestSlowAndIdleClientsCutOff: a client that sends an append's headers
// and then trickles its body is cut off at --http-read-timeout (answered
// or closed, not held), and an idle keep-alive connection is closed at
// --http-idle-timeout: no idle or slow-body connection is held for good.
func TestSlowAndIdleClientsCutOff(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) { c.HTTPReadTimeout, c.HTTPIdleTimeout = time.Second, time.Second })
	addr := strings.TrimPrefix(n.base, "http://")
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /v1/rows HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"rows\":[", addr)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // one byte every 200 ms: never done within the timeout
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				if _, err := slow.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.ReadAll(slow) // an answer then EOF, or EOF: the server let go
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a trickling body held its connection %v; want it cut off at the 1 s read timeout", took)
	}

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start = time.Now()
	_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("idle keep-alive connection: read %v after %v; want it closed at the 1 s idle timeout", err, time.Since(start))
	}
}

// TestNamespaceLabelsBounded bounds the metrics' namespace labels: with
// --metrics-namespaces 3, rows of 12 namespaces delivered by a node make at
// most 4 namespace label values ("_other" included) on every
// namespace-labelled metric, and the delivered count is complete.
func TestNamespaceLabelsBounded(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	n := startNode(t, func(c *node.Config) {
		c.MetricsNamespaces = 3
		c.DefaultTarget = tg.URL() + "/{namespace}"
	})
	var rows []rowIn
	for i := range 12 {
		for j := range 5 {
			rows = append(rows, rowIn{"dispatch_key": fmt.Sprintf("lbl-%d-%d", i, j), "namespace": fmt.Sprintf("tenant-%02d", i)})
		}
	}
	n.appendRows(rows...)
	poll.Eventually(t, 10*time.Second, "60 deliveries counted", func() (bool, string) {
		return n.metric("fairshard_rows_delivered_total") == 60, fmt.Sprintf("have %v", n.metric("fairshard_rows_delivered_total"))
	})
	// The backlog gauges are filled by the 1 s stats loop.
	poll.Eventually(t, 5*time.Second, "the backlog gauges to be filled", func() (bool, string) {
		mfs, _ := n.Registry().Gather()
		for _, mf := range mfs {
			if mf.GetName() == "fairshard_pending_rows" && len(mf.GetMetric()) > 0 {
				return true, ""
			}
		}
		return false, ""
	})
	mfs, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, mf := range mfs {
		values := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" {
					values[l.GetValue()] = true
				}
			}
		}
		if len(values) == 0 {
			continue
		}
		checked++
		if len(values) > 4 {
			t.Errorf("%s has %d namespace label values, want ≤ 4 (3 + _other): %v", mf.GetName(), len(values), values)
		}
		if strings.HasPrefix(mf.GetName(), "fairshard_rows_delivered_total") && !values["_other"] {
			t.Errorf("%s has no _other series: %v", mf.GetName(), values)
		}
	}
	if checked < 5 {
		t.Errorf("only %d namespace-labelled metrics found", checked)
	}
}

// TestShutdownClosesUnusedConnections: a connection accepted just before
// the stop whose first request never comes (a peer that dialled as the
// node went away) is closed by the stop. net/http's Shutdown treats such
// a connection as busy for 5 s and gave up after its 2 s, leaving it and
// its goroutines behind the stopped node (goleak in CI, twice).
func TestShutdownClosesUnusedConnections(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// Closed by the node: the read ends at once (EOF), not at the deadline.
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection with no request was left open by the stopped node (read: %v)", err)
	}
}
