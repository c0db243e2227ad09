package lease

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"time"
)

// MinLeaseLength is the shortest lease length: below it a grant expires
// before a refresh on a loaded machine can reach its coordinator.
const MinLeaseLength = 10 * time.Millisecond

// Timings are the exact quota mode's lease timings, the node's
// --lease-length and --lease-refresh. A zero field means the default.
type Timings struct {
	// LeaseLength is how long a grant lasts without a refresh, and how long
	// a new coordinator learns before it grants. Defaults to
	// DefaultLeaseLength (10 s); in [MinLeaseLength, MaxLeaseMS ms].
	LeaseLength time.Duration
	// Refresh is how often a node refreshes its leases (one call per
	// coordinator node). Defaults to min(DefaultRefreshInterval (250 ms),
	// LeaseLength); in [1 ms, LeaseLength].
	Refresh time.Duration
}

// RegisterFlags registers --lease-length and --lease-refresh on fs (their
// names, defaults and help are the node's), writing into t.
func (t *Timings) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&t.LeaseLength, "lease-length", DefaultLeaseLength, "exact quota mode: how long a capacity lease lasts without a refresh (and how long a new coordinator learns)")
	fs.DurationVar(&t.Refresh, "lease-refresh", DefaultRefreshInterval, "exact quota mode: how often a node refreshes its capacity leases")
}

// Validate fills the zero timings with their defaults, then checks both;
// the errors (joined) name the flag ("--lease-length: 1ms is not between
// 10ms and 10m0s"). The filled values stay in t.
func (t *Timings) Validate() error {
	t.LeaseLength = cmp.Or(t.LeaseLength, DefaultLeaseLength)
	t.Refresh = cmp.Or(t.Refresh, min(DefaultRefreshInterval, t.LeaseLength))
	var errs []error
	if t.LeaseLength < MinLeaseLength || t.LeaseLength > MaxLeaseMS*time.Millisecond {
		errs = append(errs, fmt.Errorf("--lease-length: %v is not between %v and %v", t.LeaseLength, MinLeaseLength, MaxLeaseMS*time.Millisecond))
	}
	if t.Refresh < time.Millisecond || t.Refresh > t.LeaseLength {
		errs = append(errs, fmt.Errorf("--lease-refresh: %v is not between 1ms and --lease-length %v", t.Refresh, t.LeaseLength))
	}
	return errors.Join(errs...)
}
