package quota

import (
	"context"
	"time"

	"github.com/fairshard/fairshard/shards"
)

// Ceiling is this node's ceiling for one namespace, with the policy it came
// from (for the API's namespace view and the planner's sweep report).
type Ceiling struct {
	// Rows is the most rows of the namespace this node may hold claimed at
	// once. 0 when the namespace is paused, and in exact mode when the node
	// holds no unexpired lease.
	Rows uint32
	// Quota is the namespace's cluster-wide quota (rows), as configured
	// (not zeroed by a pause).
	Quota uint32
	// QuotaDefault says Quota is the default because none is set.
	QuotaDefault bool
	// Paused is the namespace's pause flag.
	Paused bool
	// Mode is the mode Rows was computed in.
	Mode Mode
	// Expires is when an exact-mode ceiling falls to 0 unless the lease is
	// refreshed; zero in proportional mode and when there is no lease.
	Expires time.Time
}

// Headroom is how many more rows this node may claim now: Rows − claimed,
// never negative (DESIGN.md rule 1: claimed counts, pending never does). A
// ceiling below claimed only stops new claims; claimed rows finish.
func (c Ceiling) Headroom(claimed int) int {
	return max(int(c.Rows)-claimed, 0)
}

// Source gives this node's ceiling for a namespace. Implementations are
// safe for concurrent use and never fail: a policy that cannot be read
// falls back to the defaults (Policies).
type Source interface {
	Ceiling(ctx context.Context, namespace string) Ceiling
}

// Proportional is the seed's ceiling, ceil(quota × owned/total), with the
// seed's clamps (shards.NewOwnedShardFraction: total ≥ 1, owned in
// [1, total]), and 0 for a paused namespace. It answers in proportional
// mode whatever the namespace's mode is; ByMode routes by mode.
type Proportional struct {
	policies *Policies
	fraction func() shards.OwnedShardFraction
}

// NewProportional builds the proportional source. fraction returns this
// node's live OwnedShardFraction and is read on every call (nil: OwnAll, a
// single node).
func NewProportional(policies *Policies, fraction func() shards.OwnedShardFraction) *Proportional {
	if fraction == nil {
		fraction = shards.OwnAll
	}
	return &Proportional{policies: policies, fraction: fraction}
}

// Ceiling implements Source.
func (p *Proportional) Ceiling(ctx context.Context, namespace string) Ceiling {
	return p.ceiling(p.policies.Policy(ctx, namespace))
}

func (p *Proportional) ceiling(pol Policy) Ceiling {
	c := Ceiling{Quota: pol.Quota, QuotaDefault: pol.QuotaDefault, Paused: pol.Paused, Mode: ModeProportional}
	if !pol.Paused {
		c.Rows = p.fraction().PerNodeCeiling(pol.Quota)
	}
	return c
}

// Grants is where Leased reads this node's capacity leases: the lease
// client (lease.Client) implements it.
type Grants interface {
	// Grant returns this node's grant for namespace (rows) and when it
	// expires, as of now. ok is false when the node holds no unexpired
	// grant for it.
	Grant(namespace string, now time.Time) (rows uint32, expires time.Time, ok bool)
}

// Leased is the exact ceiling: this node's unexpired capacity lease for
// the namespace, capped at the configured quota (a quota lowered since the
// lease was granted takes effect at once, not at the next refresh). No
// unexpired lease, or a paused namespace, is 0. It answers in exact mode
// whatever the namespace's mode is; ByMode routes by mode.
type Leased struct {
	policies *Policies
	grants   Grants
	now      func() time.Time
}

// NewLeased builds the exact source over a lease client. now is the clock
// the leases' expiries are read against (nil: time.Now); it must be the
// clock the lease client computes expiries with.
func NewLeased(policies *Policies, grants Grants, now func() time.Time) *Leased {
	if now == nil {
		now = time.Now
	}
	return &Leased{policies: policies, grants: grants, now: now}
}

// Ceiling implements Source.
func (l *Leased) Ceiling(ctx context.Context, namespace string) Ceiling {
	return l.ceiling(namespace, l.policies.Policy(ctx, namespace))
}

func (l *Leased) ceiling(namespace string, pol Policy) Ceiling {
	c := Ceiling{Quota: pol.Quota, QuotaDefault: pol.QuotaDefault, Paused: pol.Paused, Mode: ModeExact}
	if pol.Paused {
		return c
	}
	if rows, expires, ok := l.grants.Grant(namespace, l.now()); ok {
		c.Rows, c.Expires = min(rows, pol.Quota), expires
	}
	return c
}

// ByMode routes each namespace to the proportional or the exact source by
// its policy's mode, reading the policy once per call.
type ByMode struct {
	policies     *Policies
	proportional *Proportional
	exact        *Leased
}

// NewByMode builds the per-mode source. proportional and exact should
// share policies.
func NewByMode(policies *Policies, proportional *Proportional, exact *Leased) *ByMode {
	return &ByMode{policies: policies, proportional: proportional, exact: exact}
}

// Ceiling implements Source.
func (b *ByMode) Ceiling(ctx context.Context, namespace string) Ceiling {
	pol := b.policies.Policy(ctx, namespace)
	if pol.Mode == ModeProportional {
		return b.proportional.ceiling(pol)
	}
	return b.exact.ceiling(namespace, pol)
}
