package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/outbox"
)

// Keys of the gossiped cluster config (package kv, hosted by cluster).
// Values are JSON. A namespace's settings are one key per field, so
// fields written on different nodes at the same time all survive (issue
// #16 item 8: with one document per namespace, each write carried the
// whole document as read locally and the last one undid the other's
// field).
//
//	ns/{namespace}/max_in_flight      → uint32 (deleted: the node default)
//	ns/{namespace}/paused             → bool
//	ns/{namespace}/retry              → retrySettings (deleted: the node policy)
//	target/{namespace}/{task_queue}   → targetSettings
//	hold/{workflow_id}                → {} (present = held)
//
// Namespace names cannot contain '/', so the layout is unambiguous.
const (
	prefixNamespace = "ns/"
	prefixTarget    = "target/"
	prefixHold      = "hold/"

	fieldMaxInFlight = "max_in_flight"
	fieldPaused      = "paused"
	fieldRetry       = "retry"
)

// Default caps on the gossiped config (--max-namespaces, --max-targets,
// --max-holds), checked when an admin call would add an entry (issue #13
// item 4): a call past a cap is answered 409 limit_exceeded naming it, and
// changes nothing. At their defaults they keep the config inside the kv
// store's own caps (kv.DefaultMaxEntries, kv.DefaultMaxBytes), which bound
// the state every push/pull sends; the kv caps answer 409 too (field
// "config") if big values reach them first.
const (
	// DefaultMaxNamespaces caps the namespaces with settings (any field set).
	DefaultMaxNamespaces = 5000
	// DefaultMaxTargets caps the routes with their own delivery target.
	DefaultMaxTargets = 5000
	// DefaultMaxHolds caps the workflows held at once.
	DefaultMaxHolds = 10_000
)

// nsKey is the config key of one field of a namespace's settings.
func nsKey(ns, field string) string { return prefixNamespace + ns + "/" + field }

// namespaceOfKey returns the namespace of a "ns/…" key.
func namespaceOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefixNamespace)
	if !ok {
		return "", false
	}
	ns, _, _ := strings.Cut(rest, "/")
	return ns, ns != ""
}

// namespaceSettings is a namespace's runtime config, assembled from its
// field keys. A nil MaxInFlight means "the node default"
// (--default-max-in-flight).
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
// (*kv.Store satisfies it).
type configKV interface {
	Update(ctx context.Context, writes ...kv.Write) ([]kv.Entry, error)
	Get(key string) (kv.Entry, bool)
	List(prefix string) []kv.Entry
	Count(prefix string) int
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

func newRuntimeConfig(store configKV, defaultTarget string) *runtimeConfig {
	return &runtimeConfig{kv: store, defaultTarget: defaultTarget, heldDirt: true, decoded: map[string]decodedEntry{}}
}

// decodedEntry is a config value decoded once per version.
type decodedEntry struct {
	version kv.Version
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
	e, ok := rc.kv.Get(key)
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

// namespace returns a namespace's settings; ok is false when no field of
// it is set.
func (rc *runtimeConfig) namespace(ns string) (namespaceSettings, bool) {
	var s namespaceSettings
	q, okQ := lookupJSON[uint32](rc, nsKey(ns, fieldMaxInFlight))
	if okQ {
		s.MaxInFlight = &q
	}
	p, okP := lookupJSON[bool](rc, nsKey(ns, fieldPaused))
	s.Paused = okP && p
	r, okR := lookupJSON[retrySettings](rc, nsKey(ns, fieldRetry))
	if okR {
		s.Retry = &r
	}
	return s, okQ || okP || okR
}

// namespaces returns the namespaces with settings, unsorted.
func (rc *runtimeConfig) namespaces() map[string]bool {
	out := map[string]bool{}
	for _, e := range rc.kv.List(prefixNamespace) {
		if ns, ok := namespaceOfKey(e.Key); ok {
			out[ns] = true
		}
	}
	return out
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
		for _, e := range rc.kv.List(prefixHold) {
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

// putJSON writes one JSON value under key.
func (rc *runtimeConfig) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := rc.kv.Update(ctx, kv.Write{Key: key, Value: b}); err != nil {
		return fmt.Errorf("put cluster config %q: %w", key, err)
	}
	return nil
}

func (rc *runtimeConfig) del(ctx context.Context, key string) error {
	if _, err := rc.kv.Update(ctx, kv.Write{Key: key, Delete: true}); err != nil {
		return fmt.Errorf("delete cluster config %q: %w", key, err)
	}
	return nil
}

// configPersister keeps the gossiped config in the node's bbolt file (its
// config bucket), one JSON-encoded kv.Entry per key: the kv.Persister the
// node hands cluster.
type configPersister struct{ store *boltstore.Store }

func (p configPersister) Save(ctx context.Context, e kv.Entry) error {
	b, err := encodeEntry(e)
	if err != nil {
		return err
	}
	return p.store.SaveConfigEntry(ctx, e.Key, b)
}

func (p configPersister) Forget(ctx context.Context, key string) error {
	return p.store.DeleteConfigEntry(ctx, key)
}

// encodeEntry and decodeEntry persist config entries in the store. The
// JSON field names are those of the entries older versions persisted
// (Key, Value, Deleted, Version{Clock, Node}), plus DeletedAt.
func encodeEntry(e kv.Entry) ([]byte, error) { return json.Marshal(e) }

func decodeEntry(b []byte) (kv.Entry, error) {
	var e kv.Entry
	err := json.Unmarshal(b, &e)
	return e, err
}

// loadConfig reads the persisted config entries for kv's Initial. A
// namespace's settings persisted by an older version as one document under
// "ns/{namespace}" are split into the per-field keys (with the document's
// version) and the document is removed, so a node upgraded in place keeps
// its pauses and quotas.
func loadConfig(ctx context.Context, store *boltstore.Store, log interface{ Warn(string, ...any) }) ([]kv.Entry, error) {
	saved, err := store.LoadConfigEntries(ctx)
	if err != nil {
		return nil, err
	}
	var out []kv.Entry
	for key, b := range saved {
		e, err := decodeEntry(b)
		if err != nil || e.Key != key {
			log.Warn("skipping unreadable persisted config entry", "key", key, "err", err)
			continue
		}
		rest, isNS := strings.CutPrefix(key, prefixNamespace)
		if !isNS || strings.Contains(rest, "/") {
			out = append(out, e)
			continue
		}
		fields, err := splitLegacyNamespace(e)
		if err != nil {
			log.Warn("skipping unreadable persisted namespace settings", "key", key, "err", err)
			continue
		}
		for _, f := range fields {
			b, err := encodeEntry(f)
			if err == nil {
				err = store.SaveConfigEntry(ctx, f.Key, b)
			}
			if err != nil {
				return nil, fmt.Errorf("migrate namespace settings %q: %w", key, err)
			}
		}
		if err := store.DeleteConfigEntry(ctx, key); err != nil {
			return nil, fmt.Errorf("migrate namespace settings %q: %w", key, err)
		}
		out = append(out, fields...)
	}
	return out, nil
}

// splitLegacyNamespace turns an "ns/{namespace}" document (the format
// before per-field keys) into its field entries, same version; a
// tombstone yields none. paused is always written (false when unset), so
// a namespace configured before stays listed.
func splitLegacyNamespace(e kv.Entry) ([]kv.Entry, error) {
	if e.Deleted {
		return nil, nil
	}
	var doc namespaceSettings
	if err := json.Unmarshal(e.Value, &doc); err != nil {
		return nil, err
	}
	ns := strings.TrimPrefix(e.Key, prefixNamespace)
	field := func(name string, v any) kv.Entry {
		b, _ := json.Marshal(v)
		return kv.Entry{Key: nsKey(ns, name), Value: b, Version: e.Version}
	}
	out := []kv.Entry{field(fieldPaused, doc.Paused)}
	if doc.MaxInFlight != nil {
		out = append(out, field(fieldMaxInFlight, *doc.MaxInFlight))
	}
	if doc.Retry != nil {
		out = append(out, field(fieldRetry, *doc.Retry))
	}
	return out, nil
}

// durationMS converts a timeout in ms, 0 meaning "use the default".
func durationMS(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
