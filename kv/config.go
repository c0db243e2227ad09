package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of [Config]. The caps keep a node's full state, which
// memberlist sends whole in every push/pull and refuses above 20 MiB
// (PITFALLS), well under that limit: at most DefaultMaxBytes of live
// entries plus DefaultMaxTombstones tombstones of at most
// maxTombstoneBytes each, about 8.2 MiB (docs/adr/0037-config-caps.md has
// the measured figure).
const (
	// DefaultMaxEntries caps the live (not deleted) entries.
	DefaultMaxEntries = 25_000
	// DefaultMaxBytes caps the encoded bytes of the live entries.
	DefaultMaxBytes = 6 << 20
	// DefaultMaxTombstones caps the tombstones kept: past it the oldest
	// are collected early.
	DefaultMaxTombstones = 8192
	// DefaultTombstoneMinAge is how long a tombstone is kept at least,
	// even when every member has seen it: time for its gossip to reach
	// everyone before a report of "no such key" can count as seen.
	DefaultTombstoneMinAge = 2 * time.Minute
	// DefaultTombstoneTTL is how long a tombstone is kept at most, and how
	// long a member that went away still counts as a member that must see
	// a tombstone before it is collected.
	DefaultTombstoneTTL = 24 * time.Hour
	// DefaultCollectInterval is how often RunCollect looks for tombstones
	// to collect.
	DefaultCollectInterval = 10 * time.Second
	// DefaultPersistRetryMin and DefaultPersistRetryMax bound the backoff
	// between attempts to persist an entry the Persister refused.
	DefaultPersistRetryMin = 100 * time.Millisecond
	DefaultPersistRetryMax = 10 * time.Second
)

// maxTombstoneBytes is the largest encoded tombstone: flags, clock, node,
// key, empty value and deletion time.
const maxTombstoneBytes = 1 + 10 + 2 + MaxNodeBytes + 2 + MaxKeyBytes + 1 + 10

// Errors returned by this package. Test them with errors.Is; returned
// errors wrap them with the key or limit concerned.
var (
	// ErrInvalidEntry is returned for a bad key or value (size, UTF-8).
	ErrInvalidEntry = errors.New("kv: invalid entry")
	// ErrLimit is returned by a write that would take the store past a
	// cap; the error is a *LimitError naming it.
	ErrLimit = errors.New("kv: limit reached")
	// ErrClosed is returned by writes after Close.
	ErrClosed = errors.New("kv: store closed")
	// ErrInvalidConfig is returned by New for a Config that fails
	// validation; the message names the field.
	ErrInvalidConfig = errors.New("kv: invalid config")
)

// LimitError is a write refused because it would take the store past a
// cap. It wraps ErrLimit.
type LimitError struct {
	// Limit names the cap: "entries" (Config.MaxEntries) or "bytes"
	// (Config.MaxBytes).
	Limit string
	// Max is the cap; Have is the store's figure before the write; Want is
	// what the write would have made it.
	Max, Have, Want int
}

func (e *LimitError) Error() string {
	what := map[string]string{"entries": "live config entries", "bytes": "bytes of live config entries"}[e.Limit]
	return fmt.Sprintf("kv: limit reached: the write would make %d %s, the cap is %d (now %d); delete entries first",
		e.Want, what, e.Max, e.Have)
}

// Unwrap makes errors.Is(err, ErrLimit) hold.
func (e *LimitError) Unwrap() error { return ErrLimit }

// Persister stores a node's copy of the map so a restarted node keeps it
// (the node layer backs it with its bbolt file). Calls never overlap.
type Persister interface {
	// Save durably stores e (a value or a tombstone) under e.Key,
	// replacing what was stored there.
	Save(ctx context.Context, e Entry) error
	// Forget durably removes key: its tombstone was collected.
	Forget(ctx context.Context, key string) error
}

// Config configures a [Store]. Zero values mean "use the default" as
// documented per field.
type Config struct {
	// Node is this node's name: the tie-break of its versions and the
	// sender named in its full state. Required; ≤ MaxNodeBytes bytes.
	Node string
	// Initial seeds the store at New: the entries the Persister saved
	// before a restart, tombstones included. Each needs a key and a
	// version (Clock > 0 and Node). A tombstone saved without a deletion
	// time (an older format) is dated from New.
	Initial []Entry
	// Persister, when set, stores every change. A local write is
	// persisted before it is applied (its error fails the write, nothing
	// changed); a remote change is applied at once and persisted by
	// RunPersist, retried with backoff until it succeeds.
	Persister Persister
	// Broadcast, when set, is handed every accepted change (local or
	// remote) encoded as a gossip message, for the host to spread to its
	// peers (cluster queues it in memberlist's broadcast queue). A newer
	// message for a key supersedes an older one still queued. It must not
	// block.
	Broadcast func(key string, msg []byte)

	// MaxEntries caps the live entries; a write past it fails with a
	// *LimitError. Defaults to DefaultMaxEntries.
	MaxEntries int
	// MaxBytes caps the encoded bytes of the live entries; a write past it
	// fails with a *LimitError. Defaults to DefaultMaxBytes.
	MaxBytes int
	// MaxTombstones caps the tombstones kept; past it the oldest are
	// collected early. Defaults to DefaultMaxTombstones.
	MaxTombstones int
	// TombstoneMinAge: see DefaultTombstoneMinAge.
	TombstoneMinAge time.Duration
	// TombstoneTTL: see DefaultTombstoneTTL.
	TombstoneTTL time.Duration
	// CollectInterval: see DefaultCollectInterval.
	CollectInterval time.Duration
	// PersistRetryMin and PersistRetryMax bound the persistence backoff.
	// Default to DefaultPersistRetryMin and DefaultPersistRetryMax.
	PersistRetryMin, PersistRetryMax time.Duration

	// Logger receives the store's logs. nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics of metrics.go. nil registers them on
	// a private registry. Close unregisters them.
	Registerer prometheus.Registerer
	// Now returns the current time; defaults to time.Now. Tests pin it.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxEntries, DefaultMaxEntries)
	def(&c.MaxBytes, DefaultMaxBytes)
	def(&c.MaxTombstones, DefaultMaxTombstones)
	defD(&c.TombstoneMinAge, DefaultTombstoneMinAge)
	defD(&c.TombstoneTTL, DefaultTombstoneTTL)
	defD(&c.CollectInterval, DefaultCollectInterval)
	defD(&c.PersistRetryMin, DefaultPersistRetryMin)
	defD(&c.PersistRetryMax, DefaultPersistRetryMax)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Node == "":
		return bad("Node is empty")
	case len(c.Node) > MaxNodeBytes:
		return bad("Node is %d bytes, limit %d", len(c.Node), MaxNodeBytes)
	case c.MaxEntries < 0, c.MaxBytes < 0, c.MaxTombstones < 0:
		return bad("MaxEntries, MaxBytes and MaxTombstones must not be negative")
	case c.TombstoneMinAge < 0 || c.TombstoneTTL < 0 || c.CollectInterval < 0:
		return bad("TombstoneMinAge, TombstoneTTL and CollectInterval must not be negative")
	case c.TombstoneTTL < c.TombstoneMinAge:
		return bad("TombstoneTTL %v is below TombstoneMinAge %v", c.TombstoneTTL, c.TombstoneMinAge)
	case c.PersistRetryMin < 0 || c.PersistRetryMax < c.PersistRetryMin:
		return bad("PersistRetryMin %v and PersistRetryMax %v must satisfy 0 ≤ min ≤ max", c.PersistRetryMin, c.PersistRetryMax)
	}
	for i, e := range c.Initial {
		if err := e.Validate(); err != nil {
			return bad("Initial[%d]: %v", i, err)
		}
		if e.Version.Clock == 0 || e.Version.Node == "" {
			return bad("Initial[%d] (key %q) has no version", i, e.Key)
		}
	}
	return nil
}
