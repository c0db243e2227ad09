package chaos

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Delivery headers the target reads (README "Delivery").
const (
	headerDispatchKey = "Fairshard-Dispatch-Key"
	headerNamespace   = "Fairshard-Namespace"
	headerAttempt     = "Fairshard-Attempt"
)

// target is the delivery target of a run: it answers 200 after holding each
// request for delay, and records every request with its sender (the source
// address: each node has its own), its start and end and whether it was
// answered. It judges nothing; the checkers read its record. Safe for
// concurrent use.
type target struct {
	start time.Time
	delay time.Duration
	nsIdx map[string]uint8 // namespace name → index (fixed before serving)

	nodesMu sync.RWMutex
	senders map[string]nodeIdx // sender IP → node index

	mu         sync.Mutex
	deliveries []delivery
	strays     []string
	inFlight   int

	srv *http.Server
}

func newTarget(start time.Time, delay time.Duration, namespaces []nsSpec) *target {
	t := &target{start: start, delay: delay, nsIdx: map[string]uint8{}, senders: map[string]nodeIdx{}}
	for i, ns := range namespaces {
		t.nsIdx[ns.Name] = uint8(i)
	}
	return t
}

// setNode tells the target which node sends from ip.
func (t *target) setNode(ip string, idx nodeIdx) {
	t.nodesMu.Lock()
	t.senders[ip] = idx
	t.nodesMu.Unlock()
}

// serve serves on ln until shutdown. Idle keep-alive connections are closed
// after a second so the leak check sees the nodes' delivery pools empty.
func (t *target) serve(ln net.Listener) {
	t.srv = &http.Server{Handler: t, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Second}
	go func() { _ = t.srv.Serve(ln) }()
}

func (t *target) shutdown() {
	if t.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.srv.Shutdown(ctx)
	_ = t.srv.Close()
}

func (t *target) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := delivery{start: time.Since(t.start)}
	key := r.Header.Get(headerDispatchKey)
	d.seq = seqOfKey(key)
	d.ns = 255
	if i, ok := t.nsIdx[r.Header.Get(headerNamespace)]; ok {
		d.ns = i
	}
	if n, err := strconv.Atoi(r.Header.Get(headerAttempt)); err == nil && n > 0 && n < 1<<16 {
		d.attempt = uint16(n)
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		t.nodesMu.RLock()
		d.node = t.senders[host]
		t.nodesMu.RUnlock()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 2<<20))
	t.mu.Lock()
	t.inFlight++
	t.mu.Unlock()
	select {
	case <-time.After(t.delay):
		d.ok = true
	case <-r.Context().Done():
	}
	if d.ok {
		d.answered = time.Since(t.start)
		w.WriteHeader(http.StatusOK)
		// Flush the answer before the delivery counts as done here: the
		// sender may read it only after this (a kill right now is a
		// delivery the node will repeat, which is what the checker expects).
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	d.end = time.Since(t.start)
	t.mu.Lock()
	t.inFlight--
	t.deliveries = append(t.deliveries, d)
	if d.seq < 0 || d.ns == 255 {
		t.strays = append(t.strays, key)
	}
	t.mu.Unlock()
}

// snapshotFrom returns the requests recorded from the i-th on.
func (t *target) snapshotFrom(i int) ([]delivery, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i >= len(t.deliveries) {
		return nil, len(t.deliveries)
	}
	return append([]delivery(nil), t.deliveries[i:]...), len(t.deliveries)
}

// snapshot returns every request recorded and the strays.
func (t *target) snapshot() ([]delivery, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]delivery(nil), t.deliveries...), append([]string(nil), t.strays...)
}

// count returns the number of recorded requests (answered or not).
func (t *target) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.deliveries)
}
