package boltstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/internal/bincodec"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Get implements outbox.Store: the row of dispatchKey (any shard, live or
// tombstone, packed or not, in transfer or not), or an error wrapping
// outbox.ErrNotFound.
func (s *Store) Get(ctx context.Context, dispatchKey string) (outbox.Row, error) {
	var row outbox.Row
	rk := rowKey(dispatchKey)
	err := s.view(ctx, "get "+dispatchKey, func(_ *bolt.Tx, b buckets) error {
		v := b.rows.Get(rk)
		if v == nil {
			var ok bool
			var err error
			row, ok, err = lookupBundled(b.bundles, shards.ShardOf(dispatchKey, s.opts.ShardCount), dispatchKey)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("boltstore: get %q: %w", dispatchKey, outbox.ErrNotFound)
			}
			return nil
		}
		var err error
		if row, err = decodeRow(rk, v); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil
	})
	return row, err
}

func getCounts(b *bolt.Bucket, key []byte, n int) (counts, error) {
	v := b.Get(key)
	if v == nil {
		return make(counts, n), nil
	}
	c, err := decodeCounts(v, n)
	if err != nil {
		return nil, fmt.Errorf("%w: counters under %q", ErrCorrupt, key)
	}
	return c, nil
}

// foreignShards lists the non-owned shards whose shards-bucket counters
// satisfy keep. It reads the shards bucket (at most ShardCount small
// entries, only non-zero ones stored) and nothing when every shard is owned.
func foreignShards(b buckets, owned *ownedSet, keep func(c counts) bool) ([]uint32, error) {
	if owned.all {
		return nil, nil
	}
	var out []uint32
	err := b.shards.ForEach(func(k, v []byte) error {
		if len(k) != 4 {
			return fmt.Errorf("%w: shards key %x", ErrCorrupt, k)
		}
		shard := binary.BigEndian.Uint32(k)
		if owned.has(shard) {
			return nil
		}
		c, err := decodeCounts(v, shCountsLen)
		if err != nil {
			return fmt.Errorf("%w: shard %d counters", ErrCorrupt, shard)
		}
		if keep(c) {
			out = append(out, shard)
		}
		return nil
	})
	return out, err
}

// CountClaimed implements outbox.Store: the namespace's claimed rows on
// owned shards. Cost: one counter read, plus one per non-owned shard still
// holding claimed rows (after an ownership change, until they settle).
func (s *Store) CountClaimed(ctx context.Context, namespace string) (int, error) {
	var n int64
	err := s.view(ctx, "count claimed", func(_ *bolt.Tx, b buckets) error {
		var err error
		n, err = ownedCount(b, s.owned.Load(), namespace, func(c counts) int64 { return c[nsClaimed] },
			func(c counts) int64 { return c[nssClaimed] }, func(c counts) bool { return c[shClaimed] > 0 })
		return err
	})
	return int(n), err
}

// CountInFlight implements outbox.Store: the namespace's pending + claimed
// rows on owned shards (pending rows in transfer are counted while their
// shard is owned, which happens only if ownership came back mid-transfer).
func (s *Store) CountInFlight(ctx context.Context, namespace string) (int, error) {
	var n int64
	err := s.view(ctx, "count in flight", func(_ *bolt.Tx, b buckets) error {
		var err error
		n, err = ownedCount(b, s.owned.Load(), namespace,
			func(c counts) int64 { return c[nsPending] + c[nsClaimed] },
			func(c counts) int64 { return c[nssPending] + c[nssClaimed] },
			func(c counts) bool { return c[shPending] > 0 || c[shClaimed] > 0 })
		return err
	})
	return int(n), err
}

// ownedCount is the namespace total minus what non-owned shards hold.
func ownedCount(b buckets, owned *ownedSet, namespace string, total func(counts) int64, part func(counts) int64, foreign func(counts) bool) (int64, error) {
	c, err := getCounts(b.ns, []byte(namespace), nsCountsLen)
	if err != nil {
		return 0, err
	}
	n := total(c)
	fs, err := foreignShards(b, owned, foreign)
	if err != nil {
		return 0, err
	}
	for _, shard := range fs {
		sc, err := getCounts(b.nsShard, nsShardKey(namespace, shard), nssCountsLen)
		if err != nil {
			return 0, err
		}
		n -= part(sc)
	}
	return n, nil
}

// CountClaimedByNamespace implements outbox.Store in one read transaction:
// one counter read per asked namespace; while some non-owned shard still
// holds claimed rows (after an ownership change), also one pass over each
// asked namespace's per-shard counters (one page, usually).
func (s *Store) CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error) {
	out := make(map[string]int, len(namespaces))
	err := s.view(ctx, "count claimed by namespace", func(_ *bolt.Tx, b buckets) error {
		err := eachNamespaceCounts(b, namespaces, func(ns string, c counts) {
			out[ns] = int(c[nsClaimed])
		})
		if err != nil {
			return err
		}
		fs, err := foreignShards(b, s.owned.Load(), func(c counts) bool { return c[shClaimed] > 0 })
		if err != nil {
			return err
		}
		if len(fs) == 0 {
			return nil
		}
		owned := s.owned.Load()
		// Walk the asked namespaces' per-shard ranges in key order with one
		// cursor: where ranges are adjacent, no seek is needed.
		type nsPrefix struct {
			ns     string
			prefix []byte
		}
		sorted := make([]nsPrefix, 0, len(out))
		for ns := range out {
			sorted = append(sorted, nsPrefix{ns, bincodec.AppendString(nil, ns)})
		}
		slices.SortFunc(sorted, func(a, b nsPrefix) int { return bytes.Compare(a.prefix, b.prefix) })
		c := b.nsShard.Cursor()
		var k, v []byte
		for i, p := range sorted {
			prefix := p.prefix
			if i == 0 || (k != nil && bytes.Compare(k, prefix) < 0) {
				k, v = c.Seek(prefix)
			}
			n := out[p.ns]
			for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if len(k) != len(prefix)+4 {
					return fmt.Errorf("%w: nsshard key %x", ErrCorrupt, k)
				}
				if owned.has(binary.BigEndian.Uint32(k[len(prefix):])) {
					continue
				}
				sc, err := decodeCounts(v, nssCountsLen)
				if err != nil {
					return fmt.Errorf("%w: nsshard counters %x", ErrCorrupt, k)
				}
				n -= int(sc[nssClaimed])
			}
			out[p.ns] = n
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PendingRoutes implements outbox.Store: for each route holding pending
// rows (the routes counter bucket), one seek into its range of the pending
// index finds whether a row of an owned shard is visible at now. Entries of
// non-owned shards ahead of it are stepped over; the handoff drains those.
func (s *Store) PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error) {
	var out []outbox.ClaimScope
	owned := s.owned.Load()
	err := s.view(ctx, "pending routes", func(_ *bolt.Tx, b buckets) error {
		rc := b.routes.Cursor()
		pc := b.pending.Cursor()
		for route, _ := rc.First(); route != nil; route, _ = rc.Next() {
			for k, _ := pc.Seek(route); k != nil && bytes.HasPrefix(k, route); k, _ = pc.Next() {
				tail := k[len(route):]
				if len(tail) < timeKeyLen {
					return fmt.Errorf("%w: pending index key %x", ErrCorrupt, k)
				}
				if decodeTimeKey(tail).After(now) {
					break
				}
				if owned.all || owned.has(shards.ShardOf(string(tail[timeKeyLen:]), s.opts.ShardCount)) {
					scope, err := decodeRoute(route)
					if err != nil {
						return fmt.Errorf("%w: %w", ErrCorrupt, err)
					}
					out = append(out, scope)
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b outbox.ClaimScope) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.TaskQueue, b.TaskQueue))
	})
	return out, nil
}

// NamespaceStats are one namespace's row counts on this node, all shards
// (owned or not), from the maintained counters (outbox.NamespaceStats).
type NamespaceStats = outbox.NamespaceStats

// NamespaceStats returns stats for every namespace holding rows on this
// node. Cost: one pass over the namespace counters plus one seek per route
// holding pending rows.
func (s *Store) NamespaceStats(ctx context.Context) (map[string]NamespaceStats, error) {
	out := make(map[string]NamespaceStats)
	err := s.view(ctx, "namespace stats", func(_ *bolt.Tx, b buckets) error {
		err := b.ns.ForEach(func(k, v []byte) error {
			c, err := decodeCounts(v, nsCountsLen)
			if err != nil {
				return fmt.Errorf("%w: namespace %q counters", ErrCorrupt, k)
			}
			out[string(k)] = NamespaceStats{Pending: int(c[nsPending]), Claimed: int(c[nsClaimed]),
				Done: int(c[nsDone]), Failed: int(c[nsFailed]), Cancelled: int(c[nsCancelled])}
			return nil
		})
		if err != nil {
			return err
		}
		rc := b.routes.Cursor()
		pc := b.pending.Cursor()
		for route, _ := rc.First(); route != nil; route, _ = rc.Next() {
			k, _ := pc.Seek(route)
			if k == nil || !bytes.HasPrefix(k, route) || len(k) < len(route)+timeKeyLen {
				return fmt.Errorf("%w: route %x counted but has no pending index entry", ErrCorrupt, route)
			}
			scope, err := decodeRoute(route)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			t := decodeTimeKey(k[len(route):])
			st := out[scope.Namespace]
			if st.OldestPending.IsZero() || t.Before(st.OldestPending) {
				st.OldestPending = t
				out[scope.Namespace] = st
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachNamespaceCounts calls fn with the counters of every asked namespace
// (zeros if it has none), walking the ns bucket with one cursor in key
// order: a merge join that steps with Next while the asked names are dense
// in the bucket and seeks when they are not. Cost: O(asked · log) at worst,
// O(asked) when most asked namespaces have counters.
func eachNamespaceCounts(b buckets, namespaces []string, fn func(ns string, c counts)) error {
	sorted := slices.Clone(namespaces)
	slices.Sort(sorted)
	zero := make(counts, nsCountsLen)
	c := b.ns.Cursor()
	var k, v []byte
	for i, ns := range sorted {
		if i > 0 && ns == sorted[i-1] {
			continue
		}
		want := []byte(ns)
		if k != nil && bytes.Compare(k, want) < 0 {
			k, v = c.Next() // dense case: the next key is often the next asked one
		}
		if k == nil || bytes.Compare(k, want) < 0 {
			if i == 0 || k != nil {
				k, v = c.Seek(want)
			}
		}
		if k != nil && bytes.Equal(k, want) {
			cnt, err := decodeCounts(v, nsCountsLen)
			if err != nil {
				return fmt.Errorf("%w: namespace %q counters", ErrCorrupt, ns)
			}
			fn(ns, cnt)
		} else {
			fn(ns, zero)
		}
	}
	return nil
}

// CountClaimedHeld counts, per asked namespace, every claimed row held on
// this node, owned shard or not: the conservative number for a per-node
// ceiling right after an ownership change (claimed rows of a shard just
// lost are still being delivered here). One counter read per namespace.
func (s *Store) CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error) {
	out := make(map[string]int, len(namespaces))
	err := s.view(ctx, "count claimed held", func(_ *bolt.Tx, b buckets) error {
		return eachNamespaceCounts(b, namespaces, func(ns string, c counts) { out[ns] = int(c[nsClaimed]) })
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
