package settings

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/webhook"
)

// Keys of the gossiped cluster config (package kv, hosted by cluster).
// Values are JSON. A namespace's settings are one key per field, so
// fields written on different nodes at the same time all survive (one
// document per namespace would carry the whole document as read locally,
// and the last write would undo the other's field).
//
//	ns/{namespace}/max_in_flight      → uint32 (deleted: the node default)
//	ns/{namespace}/paused             → bool
//	ns/{namespace}/retry              → RetrySettings (deleted: the node policy)
//	ns/{namespace}/mode               → "exact" | "proportional" (deleted: the node default)
//	target/{namespace}/{task_queue}   → TargetSettings
//	hold/{workflow_id}                → {} (present = held)
//
// Namespace names cannot contain '/', so the layout is unambiguous.
const (
	prefixNamespace = "ns/"
	prefixTarget    = "target/"
	// PrefixHold starts a hold's key ("hold/{workflow_id}"); with kv's
	// 128-byte key limit it bounds a workflow_id to 123 bytes.
	PrefixHold = "hold/"

	fieldMaxInFlight = "max_in_flight"
	fieldPaused      = "paused"
	fieldRetry       = "retry"
	fieldMode        = "mode"
)

// nsKey is the config key of one field of a namespace's settings.
func nsKey(ns, field string) string { return prefixNamespace + ns + "/" + field }

func targetKey(ns, tq string) string { return prefixTarget + ns + "/" + tq }

// namespaceOfKey returns the namespace of a "ns/…" key.
func namespaceOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefixNamespace)
	if !ok {
		return "", false
	}
	ns, _, _ := strings.Cut(rest, "/")
	return ns, ns != ""
}

// NamespaceSettings is a namespace's runtime config, assembled from its
// field keys (and, with these JSON names, the one-document format older
// versions persisted). A nil MaxInFlight means "the node default"
// (--default-max-in-flight).
type NamespaceSettings struct {
	MaxInFlight *uint32 `json:"max_in_flight,omitempty"`
	Paused      bool    `json:"paused,omitempty"`
	// Retry overrides the node's retry policy for this namespace; zero
	// fields keep the node's values.
	Retry *RetrySettings `json:"retry,omitempty"`
	// Mode is the quota mode; quota.ModeDefault means "the node default"
	// (--default-quota-mode).
	Mode quota.Mode `json:"mode,omitempty"`
}

// RetrySettings is a namespace's override of the node's retry policy:
// delays in ms, zero fields meaning "the node's value".
type RetrySettings struct {
	BaseMS      int64   `json:"base_ms,omitempty"`
	Factor      float64 `json:"factor,omitempty"`
	CapMS       int64   `json:"cap_ms,omitempty"`
	MaxAttempts uint32  `json:"max_attempts,omitempty"`
}

// TargetSettings is a route's delivery target as stored in the gossiped
// config: a URL template ({namespace} and {task_queue} are substituted by
// the dispatcher), a timeout in ms (0: the node's delivery timeout), the
// Standard Webhooks signing secrets ("whsec_…", newest first) and static
// request headers by canonical name. Secrets and header values are
// credentials: they are never shown by the API (Redacted) nor logged
// (String, GoString and LogValue redact them).
type TargetSettings struct {
	URL            string            `json:"url"`
	TimeoutMS      int64             `json:"timeout_ms,omitempty"`
	SigningSecrets []string          `json:"signing_secrets,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

// RedactedTarget is what the API shows of a TargetSettings: secrets by
// fingerprint (webhook.Secret.Fingerprint), headers by name, sorted.
type RedactedTarget struct {
	URL                       string   `json:"url"`
	TimeoutMS                 int64    `json:"timeout_ms"`
	SigningSecretFingerprints []string `json:"signing_secret_fingerprints"`
	HeaderNames               []string `json:"header_names"`
}

// Redacted is t without its credentials. A secret that does not parse
// (never stored by the API) shows as "invalid".
func (t TargetSettings) Redacted() RedactedTarget {
	out := RedactedTarget{URL: t.URL, TimeoutMS: t.TimeoutMS, SigningSecretFingerprints: []string{}, HeaderNames: []string{}}
	for _, s := range t.SigningSecrets {
		fp := "invalid"
		if sec, err := webhook.ParseStoredSecret(s); err == nil {
			fp = sec.Fingerprint()
		}
		out.SigningSecretFingerprints = append(out.SigningSecretFingerprints, fp)
	}
	out.HeaderNames = slices.Sorted(maps.Keys(t.Headers))
	if out.HeaderNames == nil {
		out.HeaderNames = []string{}
	}
	return out
}

// String shows the redacted form: a target printed by mistake shows no
// credential.
func (t TargetSettings) String() string {
	r := t.Redacted()
	return fmt.Sprintf("{url:%s timeout_ms:%d signing_secrets:%v headers:%v}", r.URL, r.TimeoutMS, r.SigningSecretFingerprints, r.HeaderNames)
}

// GoString is String (%#v redacts too).
func (t TargetSettings) GoString() string { return t.String() }

// LogValue is the redacted form, for slog.
func (t TargetSettings) LogValue() slog.Value {
	r := t.Redacted()
	return slog.GroupValue(slog.String("url", r.URL), slog.Int64("timeout_ms", r.TimeoutMS),
		slog.Any("signing_secret_fingerprints", r.SigningSecretFingerprints), slog.Any("header_names", r.HeaderNames))
}

// KV is what the settings need of the gossiped config store (*kv.Store
// satisfies it).
type KV interface {
	Update(ctx context.Context, writes ...kv.Write) ([]kv.Entry, error)
	Get(key string) (kv.Entry, bool)
	List(prefix string) []kv.Entry
	Count(prefix string) int
}

// Config wires Settings.
type Config struct {
	// KV is the gossiped config the settings live in. Required.
	KV KV
	// DefaultTarget is the delivery URL template of a route without a
	// target of its own ("": such routes wait).
	DefaultTarget string
	// NodeRetry is the node's retry policy, which a namespace override's
	// unset fields fall back to.
	NodeRetry dispatch.RetryPolicy
	// DefaultMaxInFlight is the quota (rows) of a namespace without one.
	DefaultMaxInFlight uint32
	// DefaultMode is the quota mode of a namespace without one
	// (quota.ModeDefault: exact).
	DefaultMode quota.Mode
	// QuotaTTL is how long a namespace's policy is cached.
	QuotaTTL time.Duration
}

// Settings are the node's runtime config: namespace quotas, pauses and
// retry overrides, delivery targets and workflow holds, read from and
// written to the gossiped config (package kv), with the caches the hot
// paths need (decoded values per entry version, the held set, the quota
// policies). Boot configuration (flags) is not here. Safe for concurrent use.
type Settings struct {
	kv            KV
	defaultTarget string
	nodeRetry     dispatch.RetryPolicy
	policies      *quota.Policies

	mu       sync.Mutex
	held     map[string]struct{}
	heldDirt bool
	decoded  map[string]decodedEntry // by config key; see lookupJSON
}

// New returns the settings over cfg.KV.
func New(cfg Config) *Settings {
	s := &Settings{kv: cfg.KV, defaultTarget: cfg.DefaultTarget, nodeRetry: cfg.NodeRetry,
		heldDirt: true, decoded: map[string]decodedEntry{}}
	s.policies = quota.NewPolicies(s, quota.Defaults{Quota: cfg.DefaultMaxInFlight, Mode: cfg.DefaultMode}, cfg.QuotaTTL)
	return s
}

// Policies returns the namespace policies (quota, pause, mode) every
// ceiling source reads (invalidated by every namespace write here and by
// Apply).
func (s *Settings) Policies() *quota.Policies { return s.policies }

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
func lookupJSON[T any](s *Settings, key string) (T, bool) {
	var zero T
	e, ok := s.kv.Get(key)
	if !ok || e.Deleted {
		return zero, false
	}
	s.mu.Lock()
	d, hit := s.decoded[key]
	s.mu.Unlock()
	if hit && d.version == e.Version {
		if !d.ok {
			return zero, false
		}
		return d.value.(T), true
	}
	var v T
	err := json.Unmarshal(e.Value, &v)
	if err == nil {
		// Gossiped values are checked like the admin API's input.
		if val, ok := any(v).(validator); ok {
			err = val.Validate()
		} else if q, ok := any(v).(uint32); ok && q > MaxQuota {
			err = fmt.Errorf("max_in_flight %d exceeds %d", q, MaxQuota)
		}
	}
	s.mu.Lock()
	s.decoded[key] = decodedEntry{version: e.Version, value: v, ok: err == nil}
	s.mu.Unlock()
	return v, err == nil
}

// Namespace returns a namespace's settings; ok is false when no field of
// it is set.
func (s *Settings) Namespace(ns string) (NamespaceSettings, bool) {
	var out NamespaceSettings
	q, okQ := lookupJSON[uint32](s, nsKey(ns, fieldMaxInFlight))
	if okQ {
		out.MaxInFlight = &q
	}
	p, okP := lookupJSON[bool](s, nsKey(ns, fieldPaused))
	out.Paused = okP && p
	r, okR := lookupJSON[RetrySettings](s, nsKey(ns, fieldRetry))
	if okR {
		out.Retry = &r
	}
	m, okM := lookupJSON[quota.Mode](s, nsKey(ns, fieldMode))
	out.Mode = m
	return out, okQ || okP || okR || okM
}

// Namespaces returns the namespaces with settings, unsorted.
func (s *Settings) Namespaces() map[string]bool {
	out := map[string]bool{}
	for _, e := range s.kv.List(prefixNamespace) {
		if ns, ok := namespaceOfKey(e.Key); ok {
			out[ns] = true
		}
	}
	return out
}

// NamespaceSettings implements quota.SettingsSource: the namespace's
// max_in_flight, pause and mode as set (quota.Policies applies the
// defaults and answers 0 for a paused namespace, in one place).
func (s *Settings) NamespaceSettings(_ context.Context, ns string) (quota.Settings, bool, error) {
	st, ok := s.Namespace(ns)
	if !ok {
		return quota.Settings{}, false, nil
	}
	return quota.Settings{MaxInFlight: st.MaxInFlight, Paused: st.Paused, Mode: st.Mode}, true, nil
}

// Paused reports whether ns is paused (dispatch.Config.Paused).
func (s *Settings) Paused(ns string) bool {
	st, _ := s.Namespace(ns)
	return st.Paused
}

// RetryPolicyFor implements dispatch.Config.RetryPolicyFor from the
// namespace's settings.
func (s *Settings) RetryPolicyFor(ns string) (dispatch.RetryPolicy, bool) {
	st, ok := s.Namespace(ns)
	if !ok || st.Retry == nil {
		return dispatch.RetryPolicy{}, false
	}
	p := dispatch.RetryPolicy{
		Base: DurationMS(st.Retry.BaseMS), Factor: st.Retry.Factor,
		Cap: DurationMS(st.Retry.CapMS), MaxAttempts: st.Retry.MaxAttempts,
	}
	// Fields left out come from the node's policy; keep the merged policy
	// valid (base ≤ cap) by moving the field the override did not set, so
	// the rest of the override (max_attempts, say) is never dropped.
	base, capd := cmp.Or(p.Base, s.nodeRetry.Base), cmp.Or(p.Cap, s.nodeRetry.Cap)
	if capd > 0 && base > capd {
		if p.Base == 0 {
			p.Base = capd
		} else {
			p.Cap = base
		}
	}
	return p, true
}

// Target resolves a route's delivery target: its own, else the node
// default. URLs are returned as templates: the dispatcher substitutes
// {namespace} and {task_queue} (dispatch.Target).
func (s *Settings) Target(route outbox.ClaimScope) (TargetSettings, bool) {
	if t, ok := lookupJSON[TargetSettings](s, targetKey(route.Namespace, route.TaskQueue)); ok && t.URL != "" {
		return t, true
	}
	if s.defaultTarget == "" {
		return TargetSettings{}, false
	}
	return TargetSettings{URL: s.defaultTarget}, true
}

// DispatchTarget is Target as the dispatcher takes it (dispatch.Targets).
func (s *Settings) DispatchTarget(route outbox.ClaimScope) (dispatch.Target, bool) {
	t, ok := s.Target(route)
	return dispatch.Target{URL: t.URL, Timeout: DurationMS(t.TimeoutMS), Headers: t.Headers, SigningSecrets: t.SigningSecrets}, ok
}

// HeldWorkflows returns the held set; the map is shared and must not be
// modified.
func (s *Settings) HeldWorkflows() map[string]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldDirt {
		held := map[string]struct{}{}
		for _, e := range s.kv.List(PrefixHold) {
			held[strings.TrimPrefix(e.Key, PrefixHold)] = struct{}{}
		}
		s.held, s.heldDirt = held, false
	}
	return s.held
}

func (s *Settings) invalidateHolds() {
	s.mu.Lock()
	s.heldDirt = true
	s.mu.Unlock()
}

// Apply drops what the caches hold for changed entries (the node calls it
// with every batch of changes its config watch reports): a changed hold
// rebuilds the held set, a changed namespace field its cached policy.
func (s *Settings) Apply(changes []kv.Entry) {
	for _, e := range changes {
		switch {
		case strings.HasPrefix(e.Key, PrefixHold):
			s.invalidateHolds()
		case strings.HasPrefix(e.Key, prefixNamespace):
			if ns, ok := namespaceOfKey(e.Key); ok {
				s.policies.Invalidate(ns)
			}
		}
	}
}

// ---- writes ----

// NamespaceUpdate is a write of some of a namespace's fields; fields left
// nil (and not cleared) keep their value. Each field is its own config
// key, so fields written at once on different nodes all survive.
type NamespaceUpdate struct {
	// MaxInFlight sets the quota (rows); ClearMaxInFlight returns it to the
	// node default.
	MaxInFlight      *uint32
	ClearMaxInFlight bool
	// Paused sets the pause.
	Paused *bool
	// Retry sets the retry override; ClearRetry returns to the node policy.
	Retry      *RetrySettings
	ClearRetry bool
	// Mode sets the quota mode (ModeExact or ModeProportional); ClearMode
	// returns it to the node default.
	Mode      quota.Mode
	ClearMode bool
}

// writes returns u's config writes in a fixed field order (max_in_flight,
// paused, retry, mode), so a batch is written the same way whatever the order
// the caller read its fields in.
func (u NamespaceUpdate) writes(ns string) []kv.Write {
	var out []kv.Write
	put := func(field string, v any) {
		b, _ := json.Marshal(v)
		out = append(out, kv.Write{Key: nsKey(ns, field), Value: b})
	}
	switch {
	case u.ClearMaxInFlight:
		out = append(out, kv.Write{Key: nsKey(ns, fieldMaxInFlight), Delete: true})
	case u.MaxInFlight != nil:
		put(fieldMaxInFlight, *u.MaxInFlight)
	}
	if u.Paused != nil {
		put(fieldPaused, *u.Paused)
	}
	switch {
	case u.ClearRetry:
		out = append(out, kv.Write{Key: nsKey(ns, fieldRetry), Delete: true})
	case u.Retry != nil:
		put(fieldRetry, *u.Retry)
	}
	switch {
	case u.ClearMode:
		out = append(out, kv.Write{Key: nsKey(ns, fieldMode), Delete: true})
	case u.Mode != quota.ModeDefault:
		put(fieldMode, u.Mode)
	}
	return out
}

// Adds reports whether u sets any field (rather than only clearing):
// such a write may add a namespace to those with settings.
func (u NamespaceUpdate) Adds() bool {
	return u.MaxInFlight != nil && !u.ClearMaxInFlight || u.Paused != nil || u.Retry != nil && !u.ClearRetry ||
		u.Mode != quota.ModeDefault && !u.ClearMode
}

// UpdateNamespace writes u's fields of ns in one kv.Update and drops the
// namespace's cached policy. An empty update writes nothing. Errors are
// kv's (kv.ErrInvalidEntry, *kv.LimitError), wrapped naming ns.
func (s *Settings) UpdateNamespace(ctx context.Context, ns string, u NamespaceUpdate) error {
	if w := u.writes(ns); len(w) > 0 {
		if _, err := s.kv.Update(ctx, w...); err != nil {
			return fmt.Errorf("set namespace %s: %w", ns, err)
		}
	}
	s.policies.Invalidate(ns)
	return nil
}

// HasTarget reports whether route (ns, tq) has a target of its own.
func (s *Settings) HasTarget(ns, tq string) bool {
	_, ok := s.kv.Get(targetKey(ns, tq))
	return ok
}

// TargetCount counts the routes with a target of their own.
func (s *Settings) TargetCount() int { return s.kv.Count(prefixTarget) }

// PutTarget sets route (ns, tq)'s target.
func (s *Settings) PutTarget(ctx context.Context, ns, tq string, t TargetSettings) error {
	return s.putJSON(ctx, targetKey(ns, tq), t)
}

// DeleteTarget removes route (ns, tq)'s own target (it falls back to the
// node default); a route without one is a no-op.
func (s *Settings) DeleteTarget(ctx context.Context, ns, tq string) error {
	return s.del(ctx, targetKey(ns, tq))
}

// IsHeld reports whether workflow wf is held.
func (s *Settings) IsHeld(wf string) bool {
	_, ok := s.kv.Get(PrefixHold + wf)
	return ok
}

// HoldCount counts the workflows held.
func (s *Settings) HoldCount() int { return s.kv.Count(PrefixHold) }

// Hold holds workflow wf: its rows stay pending until Release.
func (s *Settings) Hold(ctx context.Context, wf string) error {
	err := s.putJSON(ctx, PrefixHold+wf, struct{}{})
	s.invalidateHolds()
	return err
}

// Release releases workflow wf's hold; a workflow not held is a no-op.
func (s *Settings) Release(ctx context.Context, wf string) error {
	err := s.del(ctx, PrefixHold+wf)
	s.invalidateHolds()
	return err
}

// putJSON writes one JSON value under key.
func (s *Settings) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.kv.Update(ctx, kv.Write{Key: key, Value: b}); err != nil {
		return fmt.Errorf("put cluster config %q: %w", key, err)
	}
	return nil
}

func (s *Settings) del(ctx context.Context, key string) error {
	if _, err := s.kv.Update(ctx, kv.Write{Key: key, Delete: true}); err != nil {
		return fmt.Errorf("delete cluster config %q: %w", key, err)
	}
	return nil
}

// DurationMS converts a timeout in ms, 0 meaning "use the default".
func DurationMS(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
