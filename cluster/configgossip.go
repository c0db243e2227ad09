package cluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// Bounds of a config entry. One entry must fit in a single gossip packet
// (memberlist.Config.UDPBufferSize, 1400 bytes by default, minus headers and
// encryption overhead), so values are small documents: split larger config
// across keys.
const (
	// MaxConfigKeyBytes bounds Entry.Key (bytes).
	MaxConfigKeyBytes = 128
	// MaxConfigValueBytes bounds Entry.Value (bytes).
	MaxConfigValueBytes = 1024
)

// Version orders the writes of one config key: a Lamport clock, then the
// name of the node that wrote it as the tie-break. A node's clock moves past
// every version it has seen (its own writes, gossip, InitialConfig), so a
// write made after seeing another is always newer than it.
type Version struct {
	// Clock is the writer's Lamport time (≥ 1 for a real write).
	Clock uint64
	// Node is the writer's node name.
	Node string
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than o:
// by Clock, then by Node (byte-wise).
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.Clock, o.Clock); c != 0 {
		return c
	}
	return strings.Compare(v.Node, o.Node)
}

// String renders v as "clock@node".
func (v Version) String() string { return fmt.Sprintf("%d@%s", v.Clock, v.Node) }

// Entry is one versioned key of the gossiped cluster config. Value is
// opaque to this package (the node layer stores JSON documents: namespace
// quotas and pauses, workflow holds, delivery targets). A delete is a
// tombstone: Deleted set, Value empty. Tombstones are kept forever so a
// stale copy cannot resurrect a deleted key; persist them too.
//
// # Merge algebra
//
// Two copies of a key merge to the greater under a total order: Version,
// then a tombstone over a value, then Value byte-wise (the last two only
// matter if a version was ever reused, e.g. after a node lost its persisted
// entries). A whole config merges key by key. Taking the maximum of a total
// order is idempotent (merge(a, a) = a), commutative (merge(a, b) =
// merge(b, a)) and associative (merge(merge(a, b), c) = merge(a, merge(b,
// c))), so every node converges on the same config whatever order and
// however often gossip and push/pull deliver entries (dskit's Mergeable
// states the same laws). The tests check the three laws with rapid.
//
// Entries returned by this package are the caller's copies.
type Entry struct {
	// Key names the entry: UTF-8, 1..MaxConfigKeyBytes bytes. The node
	// layer uses prefixes such as "ns/" per namespace.
	Key string
	// Value is the opaque value, ≤ MaxConfigValueBytes bytes; empty in a
	// tombstone.
	Value []byte
	// Deleted marks a tombstone.
	Deleted bool
	// Version orders writes of Key: last writer wins.
	Version Version
}

// compareEntries is the total order of the merge algebra.
func compareEntries(a, b Entry) int {
	if c := a.Version.Compare(b.Version); c != 0 {
		return c
	}
	if a.Deleted != b.Deleted {
		if a.Deleted {
			return 1
		}
		return -1
	}
	return bytes.Compare(a.Value, b.Value)
}

// mergeEntry returns the winner of two copies of one key.
func mergeEntry(a, b Entry) Entry {
	if compareEntries(a, b) >= 0 {
		return a
	}
	return b
}

// mergeConfig merges two whole configs (key → entry) into a new map.
func mergeConfig(a, b map[string]Entry) map[string]Entry {
	out := make(map[string]Entry, max(len(a), len(b)))
	for k, e := range a {
		out[k] = e
	}
	for k, e := range b {
		if cur, ok := out[k]; ok {
			e = mergeEntry(cur, e)
		}
		out[k] = e
	}
	return out
}

func (e Entry) clone() Entry {
	e.Value = bytes.Clone(e.Value)
	return e
}

// validate checks the entry's key and value bounds.
func (e Entry) validate() error {
	switch {
	case e.Key == "":
		return errors.New("key is empty")
	case len(e.Key) > MaxConfigKeyBytes:
		return fmt.Errorf("key is %d bytes, limit %d", len(e.Key), MaxConfigKeyBytes)
	case !utf8.ValidString(e.Key):
		return fmt.Errorf("key %q is not valid UTF-8", e.Key)
	case len(e.Value) > MaxConfigValueBytes:
		return fmt.Errorf("value of key %q is %d bytes, limit %d", e.Key, len(e.Value), MaxConfigValueBytes)
	case e.Deleted && len(e.Value) > 0:
		return fmt.Errorf("tombstone of key %q carries a value", e.Key)
	case len(e.Version.Node) > MaxNodeNameBytes:
		return fmt.Errorf("version node of key %q is %d bytes, limit %d", e.Key, len(e.Version.Node), MaxNodeNameBytes)
	}
	return nil
}

// configStore is the in-memory replica of the gossiped config.
type configStore struct {
	mu      sync.RWMutex
	entries map[string]Entry
	clock   uint64 // Lamport clock
	live    int    // entries that are not tombstones
}

func newConfigStore() *configStore {
	return &configStore{entries: make(map[string]Entry)}
}

// apply merges e in and reports whether it won (changed the store).
func (s *configStore) apply(e Entry) (accepted bool, live int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = max(s.clock, e.Version.Clock) // Lamport witness
	cur, ok := s.entries[e.Key]
	if ok && compareEntries(e, cur) <= 0 {
		return false, s.live
	}
	if ok && !cur.Deleted {
		s.live--
	}
	if !e.Deleted {
		s.live++
	}
	s.entries[e.Key] = e
	return true, s.live
}

// nextVersion ticks the clock for a local write of key.
func (s *configStore) nextVersion(key, node string) Version {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = max(s.clock, s.entries[key].Version.Clock) + 1
	return Version{Clock: s.clock, Node: node}
}

func (s *configStore) get(key string) (Entry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[key]
	return e, ok
}

// list returns entries under prefix sorted by key; tombstones only if asked.
func (s *configStore) list(prefix string, tombstones bool) []Entry {
	s.mu.RLock()
	out := make([]Entry, 0, len(s.entries))
	for k, e := range s.entries {
		if strings.HasPrefix(k, prefix) && (tombstones || !e.Deleted) {
			out = append(out, e.clone())
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Gossip message kinds (first byte of a user message or of user state).
const (
	msgConfigEntry byte = 1 // one entry, broadcast
	msgConfigState byte = 2 // every entry, push/pull
)

// minEncodedEntry is the smallest encoded entry (flags, clock, three
// lengths), used to bound the count of a decoded state.
const minEncodedEntry = 5

func appendEntry(b []byte, e Entry) []byte {
	var flags byte
	if e.Deleted {
		flags |= 1
	}
	b = append(b, flags)
	b = appendUvarint(b, e.Version.Clock)
	b = appendString(b, e.Version.Node)
	b = appendString(b, e.Key)
	return appendBytes(b, e.Value)
}

func readEntry(r *reader) Entry {
	var e Entry
	flags := r.byte()
	e.Deleted = flags&1 != 0
	e.Version.Clock = r.uvarint()
	e.Version.Node = r.string(MaxNodeNameBytes)
	e.Key = r.string(MaxConfigKeyBytes)
	if v := r.bytes(MaxConfigValueBytes); len(v) > 0 {
		e.Value = bytes.Clone(v)
	}
	if r.err == nil && flags&^1 != 0 {
		r.err = fmt.Errorf("unknown entry flags %#x", flags)
	}
	return e
}

func encodeEntryMsg(e Entry) []byte {
	b := make([]byte, 0, 16+len(e.Key)+len(e.Value)+len(e.Version.Node))
	b = append(b, msgConfigEntry, ProtocolVersion)
	return appendEntry(b, e)
}

func encodeState(entries []Entry) []byte {
	b := []byte{msgConfigState, ProtocolVersion}
	b = appendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = appendEntry(b, e)
	}
	return b
}

// errGossipVersion marks a message from a node of another protocol version.
var errGossipVersion = errors.New("gossip message of another protocol version")

// decodeGossip decodes a config message or state into its entries; it never
// panics on hostile input.
func decodeGossip(b []byte) (kind byte, entries []Entry, err error) {
	r := reader{b: b}
	kind = r.byte()
	ver := r.byte()
	if r.err != nil {
		return 0, nil, fmt.Errorf("config gossip: %w", r.err)
	}
	if ver != ProtocolVersion {
		return kind, nil, fmt.Errorf("%w: %d, this node speaks %d", errGossipVersion, ver, ProtocolVersion)
	}
	switch kind {
	case msgConfigEntry:
		e := readEntry(&r)
		entries = []Entry{e}
	case msgConfigState:
		n := r.uvarint()
		if r.err == nil && n > uint64(len(r.b)/minEncodedEntry) {
			return kind, nil, fmt.Errorf("config gossip: state claims %d entries in %d bytes", n, len(r.b))
		}
		entries = make([]Entry, 0, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			entries = append(entries, readEntry(&r))
		}
	default:
		return kind, nil, fmt.Errorf("config gossip: unknown message kind %d", kind)
	}
	if r.err != nil {
		return kind, nil, fmt.Errorf("config gossip: %w", r.err)
	}
	if len(r.b) != 0 {
		return kind, nil, fmt.Errorf("config gossip: %d trailing bytes", len(r.b))
	}
	for _, e := range entries {
		if err := e.validate(); err != nil {
			return kind, nil, fmt.Errorf("config gossip: %w", err)
		}
	}
	return kind, entries, nil
}

// configBroadcast is one entry queued for gossip. It is a NamedBroadcast: a
// newer entry for the same key replaces a queued older one.
type configBroadcast struct {
	key string
	msg []byte
}

var _ memberlist.NamedBroadcast = (*configBroadcast)(nil)

func (b *configBroadcast) Name() string    { return "config/" + b.key }
func (b *configBroadcast) Message() []byte { return b.msg }
func (b *configBroadcast) Finished()       {}
func (b *configBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*configBroadcast)
	return ok && ob.key == b.key
}

// PutConfig writes key = value to the gossiped cluster config and returns
// the entry written. The value is opaque here (≤ MaxConfigValueBytes bytes;
// the key ≤ MaxConfigKeyBytes bytes of UTF-8). It returns once
// Config.ConfigPersist accepted the entry and it is applied locally and
// queued for gossip; peers see it within a few gossip rounds, a peer that
// is down catches up by push/pull when it comes back. Errors: ctx's, an
// ErrInvalidConfigEntry for a bad key or value, ErrShutdown, or the persist
// hook's (wrapped); on error nothing changed. A concurrent newer write of
// the same key (on any node) supersedes this one: last writer wins.
func (c *Cluster) PutConfig(ctx context.Context, key string, value []byte) (Entry, error) {
	return c.writeConfig(ctx, key, value, false)
}

// DeleteConfig deletes key by writing a tombstone (Deleted, no value) and
// returns it. Deleting an absent key still writes a tombstone, which also
// overrides any older write still in flight. Errors as for PutConfig.
func (c *Cluster) DeleteConfig(ctx context.Context, key string) (Entry, error) {
	return c.writeConfig(ctx, key, nil, true)
}

func (c *Cluster) writeConfig(ctx context.Context, key string, value []byte, deleted bool) (Entry, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	if c.isShutdown() {
		return Entry{}, ErrShutdown
	}
	e := Entry{Key: key, Value: bytes.Clone(value), Deleted: deleted}
	if len(e.Value) == 0 {
		e.Value = nil
	}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrInvalidConfigEntry, err)
	}
	c.persistMu.Lock()
	defer c.persistMu.Unlock()
	e.Version = c.config.nextVersion(key, c.name)
	if c.cfg.ConfigPersist != nil {
		if err := c.cfg.ConfigPersist(e.clone()); err != nil {
			return Entry{}, fmt.Errorf("persist config key %q version %s: %w", key, e.Version, err)
		}
		c.persisted[key] = e.Version
	}
	c.acceptConfig(e, "local")
	return e.clone(), nil
}

// acceptConfig merges e into the store; if it wins it updates metrics,
// wakes watchers and queues e for gossip, and for remote entries schedules
// persistence. It never blocks (memberlist callbacks call it).
func (c *Cluster) acceptConfig(e Entry, source string) bool {
	accepted, live := c.config.apply(e)
	if !accepted {
		return false
	}
	c.metrics.configUpdates.WithLabelValues(source).Inc()
	c.metrics.configEntries.Set(float64(live))
	c.broadcasts.QueueBroadcast(&configBroadcast{key: e.Key, msg: encodeEntryMsg(e)})
	if source != "local" && c.cfg.ConfigPersist != nil {
		c.persistPendingMu.Lock()
		c.persistPending[e.Key] = struct{}{}
		c.persistPendingMu.Unlock()
		poke(c.persistCh)
	}
	c.watchMu.RLock()
	for w := range c.watches {
		if strings.HasPrefix(e.Key, w.prefix) {
			w.add(e)
		}
	}
	c.watchMu.RUnlock()
	return true
}

// receiveConfig merges entries that came by gossip or push/pull.
func (c *Cluster) receiveConfig(buf []byte, from string) {
	_, entries, err := decodeGossip(buf)
	if err != nil {
		reason := "decode"
		if errors.Is(err, errGossipVersion) {
			reason = "protocol_version"
		}
		c.metrics.gossipDropped.WithLabelValues(reason).Inc()
		c.log.Warn("dropping config gossip", "from", from, "reason", reason, "error", err)
		return
	}
	for _, e := range entries {
		c.acceptConfig(e, "remote")
	}
}

// persistLoop hands remote config changes to Config.ConfigPersist, latest
// version per key, one at a time. On stop it flushes what is pending.
func (c *Cluster) persistLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			c.persistPendingOnce()
			return
		case <-c.persistCh:
			c.persistPendingOnce()
		}
	}
}

func (c *Cluster) persistPendingOnce() {
	c.persistPendingMu.Lock()
	keys := make([]string, 0, len(c.persistPending))
	for k := range c.persistPending {
		keys = append(keys, k)
	}
	clear(c.persistPending)
	c.persistPendingMu.Unlock()
	slices.Sort(keys)

	c.persistMu.Lock()
	defer c.persistMu.Unlock()
	for _, k := range keys {
		e, ok := c.config.get(k)
		if !ok || c.persisted[k] == e.Version {
			continue
		}
		if err := c.cfg.ConfigPersist(e.clone()); err != nil {
			c.metrics.configPersistErrors.Inc()
			c.log.Error("persisting remote config entry failed; a later push/pull will bring it back",
				"key", k, "version", e.Version.String(), "error", err)
			continue
		}
		c.persisted[k] = e.Version
	}
}

// GetConfig returns the live entry of key; ok is false when the key is
// absent or deleted.
func (c *Cluster) GetConfig(key string) (Entry, bool) {
	e, ok := c.config.get(key)
	if !ok || e.Deleted {
		return Entry{}, false
	}
	return e.clone(), true
}

// ListConfig returns the live entries whose key starts with prefix ("" for
// all), sorted by key.
func (c *Cluster) ListConfig(prefix string) []Entry { return c.config.list(prefix, false) }

// AllConfig returns every entry, tombstones included, sorted by key: the
// full replicated state, e.g. to compare replicas or export a backup.
func (c *Cluster) AllConfig() []Entry { return c.config.list("", true) }

// ConfigWatch delivers accepted config changes under a key prefix, local
// and remote. C receives a value whenever changes are pending; Changes
// drains them (latest entry per key, tombstones included). A slow reader
// never blocks gossip and never misses the latest value of a key: pending
// changes coalesce per key. Safe for concurrent use.
type ConfigWatch struct {
	c      *Cluster
	name   string
	prefix string
	ch     chan struct{}

	mu      sync.Mutex
	pending map[string]Entry
	closed  bool
}

// WatchConfig starts a watch of keys starting with prefix ("" for all).
// name labels the watcher in logs. Close it when done; Shutdown closes all
// watches (C is then closed).
func (c *Cluster) WatchConfig(name, prefix string) *ConfigWatch {
	w := &ConfigWatch{c: c, name: name, prefix: prefix, ch: make(chan struct{}, 1), pending: map[string]Entry{}}
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	if c.watches == nil { // shut down
		w.closed = true
		close(w.ch)
		return w
	}
	c.watches[w] = struct{}{}
	return w
}

// C returns the notification channel; it is closed by Close or Shutdown.
func (w *ConfigWatch) C() <-chan struct{} { return w.ch }

// Changes returns and forgets the pending changes, sorted by key.
func (w *ConfigWatch) Changes() []Entry {
	w.mu.Lock()
	out := make([]Entry, 0, len(w.pending))
	for _, e := range w.pending {
		out = append(out, e.clone())
	}
	clear(w.pending)
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Close stops the watch and closes C. It is idempotent.
func (w *ConfigWatch) Close() {
	w.c.watchMu.Lock()
	if w.c.watches != nil {
		delete(w.c.watches, w)
	}
	w.c.watchMu.Unlock()
	w.close()
}

func (w *ConfigWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
}

func (w *ConfigWatch) add(e Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.pending[e.Key] = e
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// poke does a non-blocking send on a 1-buffered wake-up channel: bursts of
// events merge into one wake-up.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
