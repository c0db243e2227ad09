package backpressure

import (
	"context"
	"sync"
	"time"
)

// DefaultQuota is the platform default max_in_flight (rows) of a namespace
// that has no quota record: generous, so an unconfigured tenant behaves
// like an unscoped claim.
const DefaultQuota uint32 = 1024

// DefaultQuotaTTL is how long a namespace's quota is cached.
const DefaultQuotaTTL = 2 * time.Second

// QuotaSource reads a namespace's cluster-wide quota (max_in_flight, rows).
// ok is false when the namespace has no quota record. An explicit quota of
// 0 is a valid record: that namespace is never claimed.
type QuotaSource interface {
	NamespaceQuota(ctx context.Context, namespace string) (quota uint32, ok bool, err error)
}

// QuotaSourceFunc adapts a function to QuotaSource.
type QuotaSourceFunc func(ctx context.Context, namespace string) (uint32, bool, error)

// NamespaceQuota implements QuotaSource.
func (f QuotaSourceFunc) NamespaceQuota(ctx context.Context, namespace string) (uint32, bool, error) {
	return f(ctx, namespace)
}

// QuotaCache resolves a namespace's cluster-wide quota through a QuotaSource,
// caching each answer for a TTL. A namespace with no record, or whose read
// fails, gets the default quota (seed: an outage of the config source must
// not stall dispatch; a generous default is the safe direction). Safe for
// concurrent use.
type QuotaCache struct {
	src          QuotaSource
	defaultQuota uint32
	ttl          time.Duration
	now          func() time.Time

	mu      sync.Mutex
	entries map[string]quotaEntry
}

type quotaEntry struct {
	quota   uint32
	expires time.Time
}

// NewQuotaCache builds a QuotaCache over src (nil: every namespace has
// defaultQuota). defaultQuota (rows) is the quota of a namespace with no
// record or whose read fails; pass DefaultQuota for the platform default
// (0 is taken literally: unconfigured namespaces are then never claimed).
// ttl is how long an answer is cached; 0 (or negative) caches nothing, so
// every call reads through. DefaultQuotaTTL is the usual value.
func NewQuotaCache(src QuotaSource, defaultQuota uint32, ttl time.Duration) *QuotaCache {
	return &QuotaCache{
		src:          src,
		defaultQuota: defaultQuota,
		ttl:          ttl,
		now:          time.Now,
		entries:      map[string]quotaEntry{},
	}
}

// WithClock replaces the cache's clock (for tests) and returns c.
func (c *QuotaCache) WithClock(now func() time.Time) *QuotaCache {
	c.now = now
	return c
}

// Quota returns the namespace's cluster-wide quota (rows): the cached value
// while fresh, else a read through the source. Never fails: a missing
// record or a read error yields the default quota (the error is not
// cached, so the next call retries the source).
func (c *QuotaCache) Quota(ctx context.Context, namespace string) uint32 {
	now := c.now()
	if c.ttl > 0 {
		c.mu.Lock()
		e, ok := c.entries[namespace]
		c.mu.Unlock()
		if ok && now.Before(e.expires) {
			return e.quota
		}
	}
	if c.src == nil {
		return c.defaultQuota
	}
	q, ok, err := c.src.NamespaceQuota(ctx, namespace)
	if err != nil {
		return c.defaultQuota
	}
	if !ok {
		q = c.defaultQuota
	}
	if c.ttl > 0 {
		c.mu.Lock()
		c.entries[namespace] = quotaEntry{quota: q, expires: now.Add(c.ttl)}
		c.mu.Unlock()
	}
	return q
}

// Invalidate drops a namespace's cached quota so the next call reads
// through (used when the node learns of a config change).
func (c *QuotaCache) Invalidate(namespace string) {
	c.mu.Lock()
	delete(c.entries, namespace)
	c.mu.Unlock()
}
