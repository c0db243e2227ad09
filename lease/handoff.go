package lease

import (
	"fmt"
	"io"
	"time"
)

// Coordinator hand-off: a coordinator ships, every refresh interval, what
// it holds on record for each namespace it coordinates (each node's
// holding and when it stops counting) to the namespace's successor: the
// next member of its coordinator shard's replica set, which becomes the
// coordinator if this one fails. The successor keeps the latest shipment
// per namespace (Inherit) and seeds a new term with it, so a node that
// cannot report in the new term (the old coordinator itself, paused or
// dead, with rows claimed under its own grant) still counts, until its
// lease and the delivery timeout have passed (DESIGN.md "Fencing paused
// processes"). A node that reports replaces its inherited record. What
// the old coordinator granted after its last shipment (one refresh
// interval, or a quarter lease when that shipment failed) is not known to
// the successor.

// Handoff limits.
const (
	// MaxHandoffRecords bounds the node records of one namespace in a
	// Handoff.
	MaxHandoffRecords = 1024
	// MaxHandoffBytes bounds an encoded Handoff (bytes).
	MaxHandoffBytes = 8 << 20
	// MaxHandoffShipRecords bounds the records the shipper puts in one
	// Handoff (at most ~100 bytes each encoded: well within
	// MaxHandoffBytes); more go in further calls.
	MaxHandoffShipRecords = 40_000
	// MaxForgetMS bounds a record's forget_ms: a day (a lease plus a
	// delivery timeout longer than that is not supported).
	MaxForgetMS = 24 * 60 * 60 * 1000
)

// Handoff is one coordinator's shipment to one successor.
type Handoff struct {
	// From is the shipping coordinator's node name.
	From string `json:"from"`
	// Seq orders one sender's shipments (its clock's Unix time in ns when
	// it built the shipment): an older one than the last kept from From
	// for a namespace is ignored (a call held up in transit). 0: unordered.
	Seq uint64 `json:"seq,omitempty"`
	// Namespaces has one entry per namespace, each at most once.
	Namespaces []HandoffNamespace `json:"namespaces"`
}

// HandoffNamespace is what a coordinator holds on record for one
// namespace.
type HandoffNamespace struct {
	Namespace string          `json:"namespace"`
	Records   []HandoffRecord `json:"records"`
}

// HandoffRecord is one node's holding at the shipping coordinator, with
// relative times (ms after the shipment was built) so clocks need not
// agree.
type HandoffRecord struct {
	Node string `json:"node"`
	// Holding is what the node may run at once (rows): max(grant, has).
	Holding uint32 `json:"holding"`
	// ExpiresMS is when the node's grant expires; ForgetMS when its last
	// holding stops counting (the expiry plus the delivery timeout). ms,
	// ExpiresMS ≤ ForgetMS ≤ MaxForgetMS.
	ExpiresMS uint32 `json:"expires_ms"`
	ForgetMS  uint32 `json:"forget_ms"`
}

// Validate checks a Handoff: a valid sender, at most MaxEntries
// namespaces, each valid and once, at most MaxHandoffRecords records each
// with valid node names (each once) and ordered times in range. It returns
// a *FieldError naming the first bad field.
func (h Handoff) Validate() error {
	if !ValidNodeName(h.From) {
		return fieldErr("from", "want 1 to %d bytes of UTF-8 without control characters", MaxNodeNameBytes)
	}
	if len(h.Namespaces) > MaxEntries {
		return fieldErr("namespaces", "%d namespaces exceed the limit of %d", len(h.Namespaces), MaxEntries)
	}
	seen := make(map[string]int, len(h.Namespaces))
	for i, ns := range h.Namespaces {
		at := fmt.Sprintf("namespaces[%d]", i)
		if !ValidNamespace(ns.Namespace) {
			return fieldErr(at+".namespace", "want 1 to %d bytes of letters, digits, '-', '_' and '.'", MaxNamespaceBytes)
		}
		if j, dup := seen[ns.Namespace]; dup {
			return fieldErr(at+".namespace", "%q is also namespaces[%d]", ns.Namespace, j)
		}
		seen[ns.Namespace] = i
		if len(ns.Records) > MaxHandoffRecords {
			return fieldErr(at+".records", "%d records exceed the limit of %d", len(ns.Records), MaxHandoffRecords)
		}
		nodes := make(map[string]bool, len(ns.Records))
		for k, r := range ns.Records {
			rat := fmt.Sprintf("%s.records[%d]", at, k)
			if !ValidNodeName(r.Node) {
				return fieldErr(rat+".node", "want 1 to %d bytes of UTF-8 without control characters", MaxNodeNameBytes)
			}
			if nodes[r.Node] {
				return fieldErr(rat+".node", "%q appears twice", r.Node)
			}
			nodes[r.Node] = true
			if r.ExpiresMS > r.ForgetMS || r.ForgetMS > MaxForgetMS {
				return fieldErr(rat+".forget_ms", "want expires_ms ≤ forget_ms ≤ %d", MaxForgetMS)
			}
		}
	}
	return nil
}

// DecodeHandoff reads one JSON Handoff of at most MaxHandoffBytes from r,
// rejecting unknown fields and trailing data, and validates it. Errors are
// *FieldError, or the reader's error wrapped.
func DecodeHandoff(r io.Reader) (Handoff, error) {
	data, err := readLimited(r, MaxHandoffBytes)
	if err != nil {
		return Handoff{}, err
	}
	var h Handoff
	if err := strictUnmarshal(data, &h); err != nil {
		return Handoff{}, diagnose(data, err, "namespaces", func(raw []byte) error { return strictUnmarshal(raw, new(HandoffNamespace)) })
	}
	if err := h.Validate(); err != nil {
		return Handoff{}, err
	}
	return h, nil
}

// inherited is what one sender last shipped for one namespace, on this
// node's clock.
type inherited struct {
	seq     uint64
	records []record // holding in grant and has; expires and forget set
}

// Handoff returns, as of now, what the coordinator holds on record for
// each namespace, addressed to every node successors(namespace) names
// (other than self): the Handoffs per node, each within MaxEntries
// namespaces and MaxHandoffShipRecords records (From is self, Seq now).
// Namespaces with nothing held are left out. With all false, only the
// namespaces where a node holds more than the last shipment said: the
// service ships those every refresh and all of them every quarter lease
// (a shipment's expiries then stay ahead of the next one; a holding that
// shrank meanwhile is only counted longer, never shorter).
func (c *Coordinator) Handoff(now time.Time, self string, successors func(namespace string) []string, all bool) map[string][]Handoff {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]Handoff{}
	counts := map[string]int{} // records in each node's last Handoff
	seq := uint64(now.UnixNano())
	for ns, st := range c.ns {
		if !all && !c.grown[ns] {
			continue
		}
		delete(c.grown, ns)
		var recs []HandoffRecord
		for i := range st.nodes {
			r := &st.nodes[i]
			if h := r.holding(); h > 0 && now.Before(r.forget) && len(recs) < MaxHandoffRecords {
				recs = append(recs, HandoffRecord{Node: r.node, Holding: h,
					ExpiresMS: msUntil(now, r.expires), ForgetMS: msUntil(now, r.forget)})
			}
			r.shipped = r.holding()
		}
		if len(recs) == 0 {
			continue
		}
		for _, to := range successors(ns) {
			if to == self {
				continue
			}
			hs := out[to]
			if n := len(hs); n == 0 || len(hs[n-1].Namespaces) >= MaxEntries || counts[to]+len(recs) > MaxHandoffShipRecords {
				hs = append(hs, Handoff{From: self, Seq: seq})
				counts[to] = 0
			}
			last := &hs[len(hs)-1]
			last.Namespaces = append(last.Namespaces, HandoffNamespace{Namespace: ns, Records: recs})
			counts[to] += len(recs)
			out[to] = hs
		}
	}
	return out
}

// msUntil is t − now in ms, in [0, MaxForgetMS].
func msUntil(now, t time.Time) uint32 {
	d := t.Sub(now).Milliseconds()
	return uint32(min(max(d, 0), MaxForgetMS))
}

// Inherit keeps h's records, as of now, for the namespaces this node
// would coordinate should h.From fail, replacing what h.From shipped of
// each before (unless h is older: Handoff.Seq); a new term of one of them
// starts from every sender's records still counting. It returns how many
// namespaces it kept.
func (c *Coordinator) Inherit(now time.Time, h Handoff) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := 0
	for _, ns := range h.Namespaces {
		bySender := c.inherited[ns.Namespace]
		if prev, ok := bySender[h.From]; ok && h.Seq != 0 && h.Seq < prev.seq {
			continue
		}
		in := inherited{seq: h.Seq, records: make([]record, 0, len(ns.Records))}
		for _, r := range ns.Records {
			in.records = append(in.records, record{node: r.Node, grant: r.Holding, has: r.Holding,
				expires: now.Add(time.Duration(r.ExpiresMS) * time.Millisecond),
				forget:  now.Add(time.Duration(r.ForgetMS) * time.Millisecond)})
		}
		c.keepLocked(ns.Namespace, h.From, in)
		kept++
	}
	return kept
}

// keepLocked stores in as what from holds on record for namespace. c.mu
// held.
func (c *Coordinator) keepLocked(namespace, from string, in inherited) {
	if c.inherited == nil {
		c.inherited = map[string]map[string]inherited{}
	}
	bySender := c.inherited[namespace]
	if bySender == nil {
		bySender = map[string]inherited{}
		c.inherited[namespace] = bySender
	}
	bySender[from] = in
}

// stashLocked keeps the records of a term of namespace that ends here (a
// new term starts, or this node no longer coordinates it) as inherited
// from this node: a holder that stays silent still counts if this node
// coordinates the namespace again before its record is forgotten. c.mu
// held.
func (c *Coordinator) stashLocked(now time.Time, namespace string, st *nsState) {
	var keep []record
	for _, r := range st.nodes {
		if now.Before(r.forget) && r.holding() > 0 {
			keep = append(keep, record{node: r.node, grant: r.holding(), has: r.holding(), expires: r.expires, forget: r.forget})
		}
	}
	if len(keep) > 0 {
		c.keepLocked(namespace, "", inherited{seq: uint64(now.UnixNano()), records: keep})
	}
}

// seedLocked starts a new term's state of namespace from the records
// every sender shipped of it, still counting at now: per node the largest
// holding and the latest forget time (sorted by node, as nsState keeps
// them). c.mu held.
func (c *Coordinator) seedLocked(now time.Time, namespace string, st *nsState) {
	byNode := map[string]record{}
	for _, in := range c.inherited[namespace] {
		for _, r := range in.records {
			if !now.Before(r.forget) {
				continue
			}
			cur, ok := byNode[r.node]
			if !ok {
				byNode[r.node] = r
				continue
			}
			cur.grant, cur.has = max(cur.grant, r.grant), max(cur.has, r.has)
			if r.expires.After(cur.expires) {
				cur.expires = r.expires
			}
			if r.forget.After(cur.forget) {
				cur.forget = r.forget
			}
			byNode[r.node] = cur
		}
	}
	for _, r := range byNode {
		st.nodes = append(st.nodes, r)
	}
	sortRecords(st.nodes)
}

// pruneInheritedLocked drops inherited records past their forget time.
// c.mu held.
func (c *Coordinator) pruneInheritedLocked(now time.Time) {
	for ns, bySender := range c.inherited {
		for from, in := range bySender {
			keep := in.records[:0]
			for _, r := range in.records {
				if now.Before(r.forget) {
					keep = append(keep, r)
				}
			}
			if len(keep) == 0 {
				delete(bySender, from)
				continue
			}
			in.records = keep
			bySender[from] = in
		}
		if len(bySender) == 0 {
			delete(c.inherited, ns)
		}
	}
}
