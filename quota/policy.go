package quota

import (
	"context"
	"sync"
	"time"
)

// DefaultQuota is the platform default max_in_flight (rows) of a namespace
// with no quota set: generous, so an unconfigured tenant behaves like an
// unscoped claim (the seed's default).
const DefaultQuota uint32 = 1024

// DefaultTTL is how long Policies caches a namespace's policy.
const DefaultTTL = 2 * time.Second

// Settings is what the cluster config holds for a namespace; every field
// may be unset.
type Settings struct {
	// MaxInFlight is the namespace's cluster-wide quota (rows); nil means
	// not set, so the default applies. An explicit 0 means the namespace is
	// never claimed.
	MaxInFlight *uint32
	// Paused namespaces are never claimed: every Source answers 0.
	Paused bool
	// Mode is the quota mode; ModeDefault means not set.
	Mode Mode
}

// SettingsSource reads a namespace's settings from the cluster config. ok
// is false when the namespace has no record at all.
type SettingsSource interface {
	NamespaceSettings(ctx context.Context, namespace string) (s Settings, ok bool, err error)
}

// SettingsSourceFunc adapts a function to SettingsSource.
type SettingsSourceFunc func(ctx context.Context, namespace string) (Settings, bool, error)

// NamespaceSettings implements SettingsSource.
func (f SettingsSourceFunc) NamespaceSettings(ctx context.Context, namespace string) (Settings, bool, error) {
	return f(ctx, namespace)
}

// Policy is a namespace's resolved policy: every field has a value.
type Policy struct {
	// Quota is the cluster-wide quota, max_in_flight (rows).
	Quota uint32
	// QuotaDefault says Quota is the default because none is set (or the
	// settings could not be read).
	QuotaDefault bool
	// Paused namespaces have a ceiling of 0 on every node.
	Paused bool
	// Mode is ModeExact or ModeProportional, never ModeDefault.
	Mode Mode
}

// Limit is what the whole cluster may run at once (rows): the quota, or 0
// when the namespace is paused. A lease coordinator splits this.
func (p Policy) Limit() uint32 {
	if p.Paused {
		return 0
	}
	return p.Quota
}

// Defaults are what Policies uses for unset fields.
type Defaults struct {
	// Quota (rows) of a namespace with no max_in_flight, or whose settings
	// cannot be read; DefaultQuota is the platform default. 0 is taken
	// literally: such namespaces are never claimed.
	Quota uint32
	// Mode of a namespace with no mode set; ModeDefault means ModeExact
	// (exact is the default mode).
	Mode Mode
}

// Policies resolves namespaces' policies through a SettingsSource and
// caches each answer for a TTL. It ports backpressure.QuotaCache's rules:
// a namespace with no record, or whose read fails, gets the defaults (seed:
// an outage of the config source must not stall dispatch; a generous
// default is the safe direction), and a failed read is not cached. Safe for
// concurrent use.
type Policies struct {
	src      SettingsSource
	defaults Defaults
	ttl      time.Duration
	now      func() time.Time

	mu      sync.Mutex
	entries map[string]policyEntry
}

type policyEntry struct {
	policy  Policy
	expires time.Time
}

// NewPolicies builds a Policies over src (nil: every namespace has the
// defaults). ttl is how long an answer is cached; 0 (or negative) caches
// nothing, so every call reads through. DefaultTTL is the usual value.
func NewPolicies(src SettingsSource, defaults Defaults, ttl time.Duration) *Policies {
	if defaults.Mode == ModeDefault {
		defaults.Mode = ModeExact
	}
	return &Policies{src: src, defaults: defaults, ttl: ttl, now: time.Now, entries: map[string]policyEntry{}}
}

// WithClock replaces the clock (for tests) and returns p.
func (p *Policies) WithClock(now func() time.Time) *Policies {
	p.now = now
	return p
}

// Policy returns the namespace's policy: the cached value while fresh, else
// a read through the source. It never fails: a missing record or a read
// error yields the defaults (the error is not cached, so the next call
// retries the source).
func (p *Policies) Policy(ctx context.Context, namespace string) Policy {
	now := p.now()
	if p.ttl > 0 {
		p.mu.Lock()
		e, ok := p.entries[namespace]
		p.mu.Unlock()
		if ok && now.Before(e.expires) {
			return e.policy
		}
	}
	fallback := Policy{Quota: p.defaults.Quota, QuotaDefault: true, Mode: p.defaults.Mode}
	if p.src == nil {
		return fallback
	}
	s, ok, err := p.src.NamespaceSettings(ctx, namespace)
	if err != nil {
		return fallback
	}
	pol := fallback
	if ok {
		if s.MaxInFlight != nil {
			pol.Quota, pol.QuotaDefault = *s.MaxInFlight, false
		}
		pol.Paused = s.Paused
		if s.Mode != ModeDefault {
			pol.Mode = s.Mode
		}
	}
	if p.ttl > 0 {
		p.mu.Lock()
		p.entries[namespace] = policyEntry{policy: pol, expires: now.Add(p.ttl)}
		p.mu.Unlock()
	}
	return pol
}

// Invalidate drops a namespace's cached policy so the next call reads
// through (the node calls it when it learns of a config change).
func (p *Policies) Invalidate(namespace string) {
	p.mu.Lock()
	delete(p.entries, namespace)
	p.mu.Unlock()
}
