package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/outbox"
)

// Keys of the gossiped cluster config (cluster.PutConfig). Values are JSON.
//
//	ns/{namespace}                    → namespaceSettings
//	target/{namespace}/{task_queue}   → targetSettings
//	hold/{workflow_id}                → {} (present = held)
const (
	prefixNamespace = "ns/"
	prefixTarget    = "target/"
	prefixHold      = "hold/"
)

// namespaceSettings is a namespace's runtime config. A nil MaxInFlight
// means "the node default" (--default-max-in-flight).
type namespaceSettings struct {
	MaxInFlight *uint32 `json:"max_in_flight,omitempty"`
	Paused      bool    `json:"paused,omitempty"`
	// Retry overrides the node's retry policy for this namespace; zero
	// fields keep the node's values.
	Retry *retrySettings `json:"retry,omitempty"`
}

// retrySettings is a namespace's retry policy override (issue 6:
// "overridable per namespace").
type retrySettings struct {
	BaseMS      int64   `json:"base_ms,omitempty"`
	Factor      float64 `json:"factor,omitempty"`
	CapMS       int64   `json:"cap_ms,omitempty"`
	MaxAttempts uint32  `json:"max_attempts,omitempty"`
}

// validate checks an override's bounds; the error names the field.
func (r *retrySettings) validate() error {
	switch {
	case r.BaseMS < 0 || r.BaseMS > time.Hour.Milliseconds():
		return fieldError("retry.base_ms", "must be between 0 (node default) and %d", time.Hour.Milliseconds())
	case r.Factor != 0 && (r.Factor < 1 || r.Factor > 10):
		return fieldError("retry.factor", "must be 0 (node default) or between 1 and 10")
	case r.CapMS < 0 || r.CapMS > (24*time.Hour).Milliseconds():
		return fieldError("retry.cap_ms", "must be between 0 (node default) and %d", (24 * time.Hour).Milliseconds())
	case r.CapMS > 0 && r.BaseMS > r.CapMS:
		return fieldError("retry.cap_ms", "must be at least retry.base_ms")
	case r.MaxAttempts > 1000:
		return fieldError("retry.max_attempts", "must be between 0 (node default) and 1000")
	}
	return nil
}

// retryPolicyFor implements dispatch.Config.RetryPolicyFor from the
// namespace's settings.
func (rc *runtimeConfig) retryPolicyFor(ns string) (dispatch.RetryPolicy, bool) {
	s, ok := rc.namespace(ns)
	if !ok || s.Retry == nil {
		return dispatch.RetryPolicy{}, false
	}
	p := dispatch.RetryPolicy{
		Base: durationMS(s.Retry.BaseMS), Factor: s.Retry.Factor,
		Cap: durationMS(s.Retry.CapMS), MaxAttempts: s.Retry.MaxAttempts,
	}
	// Fields left out come from the node's policy; keep the merged policy
	// valid (base ≤ cap) by moving the field the override did not set, so
	// the rest of the override (max_attempts, say) is never dropped.
	base, capd := cmpOr(p.Base, rc.nodeRetry.Base), cmpOr(p.Cap, rc.nodeRetry.Cap)
	if capd > 0 && base > capd {
		if p.Base == 0 {
			p.Base = capd
		} else {
			p.Cap = base
		}
	}
	return p, true
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// targetSettings is a route's delivery target.
type targetSettings struct {
	URL       string `json:"url"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// configKV is what the node needs of the gossiped config store
// (*cluster.Cluster satisfies it).
type configKV interface {
	PutConfig(ctx context.Context, key string, value []byte) (cluster.Entry, error)
	DeleteConfig(ctx context.Context, key string) (cluster.Entry, error)
	GetConfig(key string) (cluster.Entry, bool)
	ListConfig(prefix string) []cluster.Entry
}

// runtimeConfig reads namespace settings, targets and holds out of the
// gossiped config, caching the held set (rebuilt when a hold changes).
type runtimeConfig struct {
	kv            configKV
	defaultTarget string
	// nodeRetry is the node's retry policy, which a namespace override's
	// unset fields fall back to.
	nodeRetry dispatch.RetryPolicy

	mu       sync.Mutex
	held     map[string]struct{}
	heldDirt bool
	decoded  map[string]decodedEntry // by config key; see lookupJSON
}

func newRuntimeConfig(kv configKV, defaultTarget string) *runtimeConfig {
	return &runtimeConfig{kv: kv, defaultTarget: defaultTarget, heldDirt: true, decoded: map[string]decodedEntry{}}
}

// decodedEntry is a config value decoded once per version.
type decodedEntry struct {
	version cluster.Version
	value   any
	ok      bool
}

// lookupJSON returns the JSON value under key decoded into T. Sweeps ask for
// every pending route's settings and target, and deliveries for each row's
// target: decoding is cached per entry version, so a value is decoded once
// per change, not per call (the version makes the cache exact: nothing to
// invalidate). ok is false when the key is absent, deleted or undecodable.
func lookupJSON[T any](rc *runtimeConfig, key string) (T, bool) {
	var zero T
	e, ok := rc.kv.GetConfig(key)
	if !ok || e.Deleted {
		return zero, false
	}
	rc.mu.Lock()
	d, hit := rc.decoded[key]
	rc.mu.Unlock()
	if hit && d.version == e.Version {
		if !d.ok {
			return zero, false
		}
		return d.value.(T), true
	}
	var v T
	err := json.Unmarshal(e.Value, &v)
	rc.mu.Lock()
	rc.decoded[key] = decodedEntry{version: e.Version, value: v, ok: err == nil}
	rc.mu.Unlock()
	return v, err == nil
}

func (rc *runtimeConfig) namespace(ns string) (namespaceSettings, bool) {
	return lookupJSON[namespaceSettings](rc, prefixNamespace+ns)
}

// NamespaceQuota implements backpressure.QuotaSource: the namespace's
// max_in_flight when set; paused namespaces report 0 (never claimed).
func (rc *runtimeConfig) NamespaceQuota(_ context.Context, ns string) (uint32, bool, error) {
	s, ok := rc.namespace(ns)
	if !ok {
		return 0, false, nil
	}
	if s.Paused {
		return 0, true, nil
	}
	if s.MaxInFlight == nil {
		return 0, false, nil
	}
	return *s.MaxInFlight, true, nil
}

func (rc *runtimeConfig) paused(ns string) bool {
	s, _ := rc.namespace(ns)
	return s.Paused
}

// target resolves a route's delivery target: its own, else the node
// default. URLs are returned as templates: the dispatcher substitutes
// {namespace} and {task_queue} (dispatch.Target).
func (rc *runtimeConfig) target(route outbox.ClaimScope) (targetSettings, bool) {
	if t, ok := lookupJSON[targetSettings](rc, prefixTarget+route.Namespace+"/"+route.TaskQueue); ok && t.URL != "" {
		return t, true
	}
	if rc.defaultTarget == "" {
		return targetSettings{}, false
	}
	return targetSettings{URL: rc.defaultTarget}, true
}

// heldWorkflows returns the held set; the map is shared and must not be
// modified.
func (rc *runtimeConfig) heldWorkflows() map[string]struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.heldDirt {
		held := map[string]struct{}{}
		for _, e := range rc.kv.ListConfig(prefixHold) {
			held[strings.TrimPrefix(e.Key, prefixHold)] = struct{}{}
		}
		rc.held, rc.heldDirt = held, false
	}
	return rc.held
}

func (rc *runtimeConfig) invalidateHolds() {
	rc.mu.Lock()
	rc.heldDirt = true
	rc.mu.Unlock()
}

func (rc *runtimeConfig) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := rc.kv.PutConfig(ctx, key, b); err != nil {
		return fmt.Errorf("put cluster config %q: %w", key, err)
	}
	return nil
}

func (rc *runtimeConfig) del(ctx context.Context, key string) error {
	if _, err := rc.kv.DeleteConfig(ctx, key); err != nil {
		return fmt.Errorf("delete cluster config %q: %w", key, err)
	}
	return nil
}

// encodeEntry and decodeEntry persist cluster config entries in the store.
func encodeEntry(e cluster.Entry) ([]byte, error) { return json.Marshal(e) }

func decodeEntry(b []byte) (cluster.Entry, error) {
	var e cluster.Entry
	err := json.Unmarshal(b, &e)
	return e, err
}

// durationMS converts a timeout in ms, 0 meaning "use the default".
func durationMS(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
