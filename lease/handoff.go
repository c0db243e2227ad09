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
// interval at most) is not known to the successor.

// Handoff limits.
const (
	// MaxHandoffRecords bounds the node records of one namespace in a
	// Handoff.
	MaxHandoffRecords = 1024
	// MaxHandoffBytes bounds an encoded Handoff (bytes).
	MaxHandoffBytes = 8 << 20
)

// Handoff is one coordinator's shipment to one successor.
type Handoff struct {
	// From is the shipping coordinator's node name.
	From string `json:"from"`
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
	// ExpiresMS ≤ ForgetMS ≤ 2 × MaxLeaseMS.
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
			if r.ExpiresMS > r.ForgetMS || r.ForgetMS > 2*MaxLeaseMS {
				return fieldErr(rat+".forget_ms", "want expires_ms ≤ forget_ms ≤ %d", 2*MaxLeaseMS)
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

// inherited is a successor's latest shipment for one namespace, on its
// own clock.
type inherited struct {
	from    string
	records []record // holding in grant and has; expires and forget set
}

// Handoff returns, as of now, what the coordinator holds on record for
// each namespace whose successor(namespace) names a node: one Handoff per
// successor (From is self). Namespaces with nothing held are left out.
func (c *Coordinator) Handoff(now time.Time, self string, successor func(namespace string) (string, bool)) map[string]Handoff {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]Handoff{}
	for ns, st := range c.ns {
		to, ok := successor(ns)
		if !ok || to == self {
			continue
		}
		var recs []HandoffRecord
		for i := range st.nodes {
			r := &st.nodes[i]
			if h := r.holding(); h > 0 && now.Before(r.forget) && len(recs) < MaxHandoffRecords {
				recs = append(recs, HandoffRecord{Node: r.node, Holding: h,
					ExpiresMS: msUntil(now, r.expires), ForgetMS: msUntil(now, r.forget)})
			}
		}
		if len(recs) == 0 {
			continue
		}
		h := out[to]
		if len(h.Namespaces) >= MaxEntries {
			continue
		}
		h.From = self
		h.Namespaces = append(h.Namespaces, HandoffNamespace{Namespace: ns, Records: recs})
		out[to] = h
	}
	return out
}

// msUntil is t − now in ms, in [0, 2 × MaxLeaseMS].
func msUntil(now, t time.Time) uint32 {
	d := t.Sub(now).Milliseconds()
	return uint32(min(max(d, 0), 2*MaxLeaseMS))
}

// Inherit keeps h's records, as of now, for the namespaces this node
// would coordinate should h.From fail (replacing an earlier shipment of
// each); a new term of one of them starts from them. It returns how many
// namespaces it kept.
func (c *Coordinator) Inherit(now time.Time, h Handoff) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inherited == nil {
		c.inherited = map[string]inherited{}
	}
	for _, ns := range h.Namespaces {
		in := inherited{from: h.From, records: make([]record, 0, len(ns.Records))}
		for _, r := range ns.Records {
			in.records = append(in.records, record{node: r.Node, grant: r.Holding, has: r.Holding,
				expires: now.Add(time.Duration(r.ExpiresMS) * time.Millisecond),
				forget:  now.Add(time.Duration(r.ForgetMS) * time.Millisecond)})
		}
		c.inherited[ns.Namespace] = in
	}
	return len(h.Namespaces)
}

// seedLocked starts a new term's state of namespace from its inherited
// records still counting at now (sorted by node, as nsState keeps them),
// and drops them. c.mu held.
func (c *Coordinator) seedLocked(now time.Time, namespace string, st *nsState) {
	in, ok := c.inherited[namespace]
	if !ok {
		return
	}
	delete(c.inherited, namespace)
	for _, r := range in.records {
		if now.Before(r.forget) {
			st.nodes = append(st.nodes, r)
		}
	}
	sortRecords(st.nodes)
}

// pruneInheritedLocked drops inherited records past their forget time.
// c.mu held.
func (c *Coordinator) pruneInheritedLocked(now time.Time) {
	for ns, in := range c.inherited {
		keep := in.records[:0]
		for _, r := range in.records {
			if now.Before(r.forget) {
				keep = append(keep, r)
			}
		}
		if len(keep) == 0 {
			delete(c.inherited, ns)
			continue
		}
		in.records = keep
		c.inherited[ns] = in
	}
}
