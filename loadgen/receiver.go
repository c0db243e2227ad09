package loadgen

import (
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshard/fairshard/webhook"
)

// Delivery header names the receiver reads (set by fairshard's dispatcher).
const (
	HeaderDispatchKey = "Fairshard-Dispatch-Key"
	HeaderNamespace   = "Fairshard-Namespace"
	HeaderAttempt     = "Fairshard-Attempt"
)

// Receiver is a delivery target that records what it receives. Build one
// with NewReceiver; serve it with net/http. Safe for concurrent use.
type Receiver struct {
	// Delay is how long each request is held before it is answered (a
	// target's latency). Set before serving; read atomically.
	delay atomic.Int64
	// Status, when non-zero, is answered instead of 200 (fault injection).
	status atomic.Int32
	// secrets, when set, make the receiver verify every request's
	// Standard Webhooks signature (SetSigningSecrets).
	secrets   atomic.Pointer[[]webhook.Secret]
	verified  atomic.Int64
	sigFailed atomic.Int64

	mu         sync.Mutex
	deliveries map[string]int // dispatch_key → successful deliveries
	requests   map[string]int // dispatch_key → requests received, whatever their outcome
	inFlight   int            // requests being held now, all namespaces
	maxIn      int            // most requests held at once, all namespaces
	namespaces map[string]*nsStats
	total      atomic.Int64
	last       atomic.Int64 // unix nanos of the latest successful delivery
	start      time.Time
}

type nsStats struct {
	inFlight    int
	maxInFlight int
	delivered   int
	latency     Latencies
}

// NewReceiver returns a receiver that holds each request for delay.
func NewReceiver(delay time.Duration) *Receiver {
	r := &Receiver{deliveries: map[string]int{}, requests: map[string]int{}, namespaces: map[string]*nsStats{}, start: time.Now()}
	r.delay.Store(int64(delay))
	return r
}

// SetDelay changes the per-request hold time.
func (r *Receiver) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// SetStatus makes every following request answer status (0 restores 200).
func (r *Receiver) SetStatus(status int) { r.status.Store(int32(status)) }

// SetSigningSecrets makes the receiver verify every request's Standard
// Webhooks signature (package webhook, DefaultTolerance) against any of
// secrets, as a real target would: a request that fails is answered 401,
// counted by SignatureFailures and not recorded as delivered (it still
// counts in Requests). No secrets: nothing is verified.
func (r *Receiver) SetSigningSecrets(secrets []webhook.Secret) {
	if len(secrets) == 0 {
		r.secrets.Store(nil)
		return
	}
	s := append([]webhook.Secret(nil), secrets...)
	r.secrets.Store(&s)
}

// SignatureFailures is how many requests failed verification (see
// SetSigningSecrets); Verified how many passed.
func (r *Receiver) SignatureFailures() int64 { return r.sigFailed.Load() }

// Verified is how many requests' signatures were verified.
func (r *Receiver) Verified() int64 { return r.verified.Load() }

func (r *Receiver) ns(name string) *nsStats {
	s, ok := r.namespaces[name]
	if !ok {
		s = &nsStats{}
		r.namespaces[name] = s
	}
	return s
}

// ServeHTTP implements http.Handler: it tracks in-flight per namespace,
// holds the request for the configured delay, and on success records the
// delivery and its append-to-delivery latency (from the payload's "t",
// unix nanoseconds, as Generator writes it).
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	key := req.Header.Get(HeaderDispatchKey)
	ns := req.Header.Get(HeaderNamespace)
	body, _ := io.ReadAll(io.LimitReader(req.Body, 2<<20))
	r.mu.Lock()
	st := r.ns(ns)
	st.inFlight++
	st.maxInFlight = max(st.maxInFlight, st.inFlight)
	r.requests[key]++
	r.inFlight++
	r.maxIn = max(r.maxIn, r.inFlight)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inFlight--
		r.mu.Unlock()
	}()

	if d := time.Duration(r.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-req.Context().Done():
		}
	}
	status := int(r.status.Load())
	if secrets := r.secrets.Load(); secrets != nil {
		if err := webhook.Verify(req.Header, body, time.Now(), 0, (*secrets)...); err != nil {
			r.sigFailed.Add(1)
			r.mu.Lock()
			st.inFlight--
			r.mu.Unlock()
			http.Error(w, "signature: "+err.Error(), http.StatusUnauthorized)
			return
		}
		r.verified.Add(1)
	}
	if req.Context().Err() != nil {
		// The sender gave up (timeout, hard stop): it will not record this
		// delivery as done, so neither do we.
		r.mu.Lock()
		st.inFlight--
		r.mu.Unlock()
		return
	}
	now := time.Now()
	r.mu.Lock()
	st.inFlight--
	if status == 0 {
		r.deliveries[key]++
		st.delivered++
	}
	r.mu.Unlock()
	if status != 0 {
		http.Error(w, "injected failure", status)
		return
	}
	r.total.Add(1)
	r.last.Store(now.UnixNano())
	var p struct {
		T int64 `json:"t"`
	}
	if json.Unmarshal(body, &p) == nil && p.T > 0 {
		st.latency.Add(now.Sub(time.Unix(0, p.T)))
	}
	w.WriteHeader(http.StatusOK)
}

// Requests returns how many requests the receiver got for each
// dispatch_key, whatever their outcome: answered, failed on purpose
// (SetStatus) or abandoned by the sender mid-request. More than one for a
// key the sender delivered once is a repeat delivery. The map is the
// caller's.
func (r *Receiver) Requests() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.requests))
	for k, n := range r.requests {
		out[k] = n
	}
	return out
}

// MaxInFlight returns the most requests the receiver held at once, all
// namespaces together.
func (r *Receiver) MaxInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxIn
}

// Delivered returns the number of successful deliveries (duplicates
// included).
func (r *Receiver) Delivered() int64 { return r.total.Load() }

// LastDelivery returns when the latest successful delivery arrived (zero
// before the first).
func (r *Receiver) LastDelivery() time.Time {
	if n := r.last.Load(); n > 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Count returns how many times key was delivered successfully.
func (r *Receiver) Count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deliveries[key]
}

// Distinct returns the number of distinct dispatch_keys delivered.
func (r *Receiver) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.deliveries)
}

// Duplicates returns the keys delivered more than once, with their counts.
func (r *Receiver) Duplicates() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, n := range r.deliveries {
		if n > 1 {
			out[k] = n
		}
	}
	return out
}

// NamespaceReport is what the receiver saw of one namespace.
type NamespaceReport struct {
	Namespace   string  `json:"namespace"`
	Delivered   int     `json:"delivered"`
	InFlight    int     `json:"in_flight"`
	MaxInFlight int     `json:"max_in_flight"`
	Latency     Summary `json:"latency"`
}

// Namespaces reports every namespace seen, sorted by name.
func (r *Receiver) Namespaces() []NamespaceReport {
	r.mu.Lock()
	names := make([]string, 0, len(r.namespaces))
	for n := range r.namespaces {
		names = append(names, n)
	}
	r.mu.Unlock()
	sort.Strings(names)
	out := make([]NamespaceReport, 0, len(names))
	for _, n := range names {
		r.mu.Lock()
		st := r.namespaces[n]
		rep := NamespaceReport{Namespace: n, Delivered: st.delivered, InFlight: st.inFlight, MaxInFlight: st.maxInFlight}
		r.mu.Unlock()
		rep.Latency = st.latency.Summary()
		out = append(out, rep)
	}
	return out
}

// Latency returns the namespace's append-to-delivery latencies.
func (r *Receiver) Latency(namespace string) *Latencies {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &r.ns(namespace).latency
}

// Keys returns every delivered dispatch_key.
func (r *Receiver) Keys() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.deliveries))
	for k, n := range r.deliveries {
		out[k] = n
	}
	return out
}
