package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/kv"
)

// Limits of the admin API.
const (
	MaxQuota         = 1_000_000
	MaxTargetTimeout = 10 * time.Minute
	// MaxTargetURLBytes keeps a target within the gossiped config's 1 KiB
	// value limit, JSON envelope included.
	MaxTargetURLBytes = 900
	maxDeadLetterPage = 1000
)

// namespaceView is GET /v1/namespaces/{ns}: the namespace's cluster-wide
// settings plus this node's counts, ceiling and headroom.
type namespaceView struct {
	Namespace string `json:"namespace"`
	// MaxInFlight is the cluster-wide quota (rows); MaxInFlightDefault says
	// whether it is the node default because none was set.
	MaxInFlight        uint32 `json:"max_in_flight"`
	MaxInFlightDefault bool   `json:"max_in_flight_default"`
	Paused             bool   `json:"paused"`
	// Retry is the namespace's retry policy override, if any.
	Retry *retrySettings `json:"retry,omitempty"`
	// Node is the node these counts come from.
	Node               string  `json:"node"`
	Pending            int     `json:"pending"`
	Claimed            int     `json:"claimed"`
	DeadLetters        int     `json:"dead_letters"`
	OwnedShardFraction float64 `json:"owned_shard_fraction"`
	// Ceiling is this node's per-node ceiling, ceil(quota × owned/total);
	// Headroom is Ceiling − Claimed (≥ 0).
	Ceiling  uint32 `json:"ceiling"`
	Headroom int    `json:"headroom"`
	// WaitingRoutes are task queues whose rows wait because no delivery
	// target is configured for them (nor a node default).
	WaitingRoutes []string `json:"waiting_routes,omitempty"`
}

func (n *Node) namespaceView(ns string, st boltstore.NamespaceStats) namespaceView {
	s, _ := n.rc.namespace(ns)
	v := namespaceView{Namespace: ns, Paused: s.Paused, Retry: s.Retry, Node: n.name,
		Pending: st.Pending, Claimed: st.Claimed, DeadLetters: st.Failed}
	if s.MaxInFlight != nil {
		v.MaxInFlight = *s.MaxInFlight
	} else {
		v.MaxInFlight, v.MaxInFlightDefault = n.cfg.DefaultMaxInFlight, true
	}
	f := n.ownership().Fraction
	v.OwnedShardFraction = f.Float()
	quota := v.MaxInFlight
	if s.Paused {
		quota = 0
	}
	v.Ceiling = f.PerNodeCeiling(quota)
	v.Headroom = max(int(v.Ceiling)-st.Claimed, 0)
	for _, r := range n.disp.RoutesWithoutTarget() {
		if r.Namespace == ns {
			v.WaitingRoutes = append(v.WaitingRoutes, r.TaskQueue)
		}
	}
	return v
}

func (n *Node) handleListNamespaces(w http.ResponseWriter, r *http.Request) {
	stats, err := n.store.NamespaceStats(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	names := map[string]bool{}
	for ns := range stats {
		names[ns] = true
	}
	for ns := range n.rc.namespaces() {
		names[ns] = true
	}
	sorted := make([]string, 0, len(names))
	for ns := range names {
		sorted = append(sorted, ns)
	}
	sort.Strings(sorted)
	out := make([]namespaceView, 0, len(sorted))
	for _, ns := range sorted {
		out = append(out, n.namespaceView(ns, stats[ns]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"namespaces": out})
}

func (n *Node) handleGetNamespace(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	stats, err := n.store.NamespaceStats(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, n.namespaceView(ns, stats[ns]))
}

// handlePutNamespace sets max_in_flight, paused and/or retry; absent
// fields keep their value, and only the fields present are written (each
// is its own config key), so fields set at once on different nodes all
// survive. max_in_flight or retry null returns the field to the node's
// default. A namespace beyond MaxNamespaces is refused (409).
func (n *Node) handlePutNamespace(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	var body map[string]json.RawMessage
	if err := decodeBody(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	var writes []kv.Write
	put := func(field string, v any) {
		b, _ := json.Marshal(v)
		writes = append(writes, kv.Write{Key: nsKey(ns, field), Value: b})
	}
	// Fields in a fixed order, so a batch is written the same way whatever
	// the body's key order.
	for _, k := range slices.Sorted(maps.Keys(body)) {
		raw := body[k]
		switch k {
		case fieldMaxInFlight:
			if isNull(raw) {
				writes = append(writes, kv.Write{Key: nsKey(ns, k), Delete: true})
				continue
			}
			q, err := strconv.ParseUint(string(raw), 10, 32)
			if err != nil || q > MaxQuota {
				writeError(w, fieldError("max_in_flight", "must be an integer from 0 to %d (or null for the default)", MaxQuota))
				return
			}
			put(k, uint32(q))
		case fieldPaused:
			switch string(raw) {
			case "true":
				put(k, true)
			case "false":
				put(k, false)
			default:
				writeError(w, fieldError("paused", "must be true or false"))
				return
			}
		case fieldRetry:
			if isNull(raw) {
				writes = append(writes, kv.Write{Key: nsKey(ns, k), Delete: true})
				continue
			}
			var rs retrySettings
			if err := strictUnmarshal(raw, &rs); err != nil {
				writeError(w, fieldError("retry", "must be an object with base_ms, factor, cap_ms, max_attempts: %v", err))
				return
			}
			if err := rs.validate(); err != nil {
				writeError(w, err)
				return
			}
			put(k, rs)
		default:
			writeError(w, fieldError(k, "unknown field (want max_in_flight, paused, retry)"))
			return
		}
	}
	if _, configured := n.rc.namespace(ns); !configured && slices.ContainsFunc(writes, func(w kv.Write) bool { return !w.Delete }) {
		if have := len(n.rc.namespaces()); have >= n.cfg.MaxNamespaces {
			writeError(w, limitExceeded("namespace", "%d namespaces have settings, the limit is %d (--max-namespaces); namespaces without settings use the node defaults", have, n.cfg.MaxNamespaces))
			return
		}
	}
	if len(writes) > 0 {
		if _, err := n.rc.kv.Update(r.Context(), writes...); err != nil {
			writeError(w, fmt.Errorf("set namespace %s: %w", ns, err))
			return
		}
	}
	n.quota.Invalidate(ns)
	n.disp.Wake()
	stats, _ := n.store.NamespaceStats(r.Context())
	writeJSON(w, http.StatusOK, n.namespaceView(ns, stats[ns]))
}

// routeFromPath reads and validates {ns} and {tq} of a target path.
func routeFromPath(r *http.Request) (ns, tq string, err error) {
	if ns, err = pathName(r, "ns"); err != nil {
		return "", "", err
	}
	if tq, err = pathName(r, "tq"); err != nil {
		return "", "", err
	}
	return ns, tq, nil
}

func (n *Node) handlePutTarget(w http.ResponseWriter, r *http.Request) {
	ns, tq, err := routeFromPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var t targetSettings
	if err := decodeBody(w, r, &t); err != nil {
		writeError(w, err)
		return
	}
	if len(t.URL) > MaxTargetURLBytes {
		writeError(w, fieldError("url", "is %d bytes, the limit is %d", len(t.URL), MaxTargetURLBytes))
		return
	}
	if err := checkText("url", t.URL, MaxTargetURLBytes); err != nil {
		writeError(w, err)
		return
	}
	u, perr := url.Parse(strings.NewReplacer("{namespace}", "ns", "{task_queue}", "tq").Replace(t.URL))
	if t.URL == "" || perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		writeError(w, fieldError("url", "must be an absolute http(s) URL"))
		return
	}
	if t.TimeoutMS < 0 || durationMS(t.TimeoutMS) > MaxTargetTimeout {
		writeError(w, fieldError("timeout_ms", "must be between 0 (node default) and %d", MaxTargetTimeout.Milliseconds()))
		return
	}
	key := prefixTarget + ns + "/" + tq
	if _, exists := n.rc.kv.Get(key); !exists {
		if have := n.rc.kv.Count(prefixTarget); have >= n.cfg.MaxTargets {
			writeError(w, limitExceeded("target", "%d routes have their own target, the limit is %d (--max-targets); use --default-target with {namespace} and {task_queue} for many routes", have, n.cfg.MaxTargets))
			return
		}
	}
	if err := n.rc.putJSON(r.Context(), key, t); err != nil {
		writeError(w, err)
		return
	}
	n.disp.Wake()
	writeJSON(w, http.StatusOK, map[string]any{"namespace": ns, "task_queue": tq, "url": t.URL, "timeout_ms": t.TimeoutMS})
}

func (n *Node) handleDeleteTarget(w http.ResponseWriter, r *http.Request) {
	ns, tq, err := routeFromPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := n.rc.del(r.Context(), prefixTarget+ns+"/"+tq); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func holdKey(r *http.Request) (string, error) {
	wf := r.PathValue("wf")
	if wf == "" || len(wf) > MaxWorkflowIDBytes {
		return "", fieldError("workflow_id", "must be 1-%d bytes", MaxWorkflowIDBytes)
	}
	if err := checkText("workflow_id", wf, MaxWorkflowIDBytes); err != nil {
		return "", err
	}
	return prefixHold + wf, nil
}

func (n *Node) handleHold(w http.ResponseWriter, r *http.Request) {
	key, err := holdKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, held := n.rc.kv.Get(key); !held {
		if have := n.rc.kv.Count(prefixHold); have >= n.cfg.MaxHolds {
			writeError(w, limitExceeded("hold", "%d workflows are held, the limit is %d (--max-holds); release some first", have, n.cfg.MaxHolds))
			return
		}
	}
	if err := n.rc.putJSON(r.Context(), key, struct{}{}); err != nil {
		writeError(w, err)
		return
	}
	n.rc.invalidateHolds()
	writeJSON(w, http.StatusOK, map[string]any{"workflow_id": r.PathValue("wf"), "held": true})
}

func (n *Node) handleRelease(w http.ResponseWriter, r *http.Request) {
	key, err := holdKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := n.rc.del(r.Context(), key); err != nil {
		writeError(w, err)
		return
	}
	n.rc.invalidateHolds()
	n.disp.Wake()
	writeJSON(w, http.StatusOK, map[string]any{"workflow_id": r.PathValue("wf"), "held": false})
}

// ---- dead letters (fanned out to every member) ----

func deadLetterPage(r *http.Request) (after string, limit int, err error) {
	after = r.URL.Query().Get("after")
	limit = 100
	if s := r.URL.Query().Get("limit"); s != "" {
		limit, err = strconv.Atoi(s)
		if err != nil || limit < 1 || limit > maxDeadLetterPage {
			return "", 0, fieldError("limit", "must be an integer from 1 to %d", maxDeadLetterPage)
		}
	}
	return after, limit, nil
}

func (n *Node) handleInternalDeadLetters(w http.ResponseWriter, r *http.Request) {
	after, limit, err := deadLetterPage(r)
	if err != nil {
		writeError(w, err)
		return
	}
	rows, err := n.store.ListDeadLetters(r.Context(), r.PathValue("ns"), after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, deadLettersResp{Rows: viewsOf(rows, n.name)})
}

// handleDeadLetters lists a namespace's dead letters across the cluster,
// ordered by dispatch_key; "next" is the cursor for ?after=.
func (n *Node) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	after, limit, err := deadLetterPage(r)
	if err != nil {
		writeError(w, err)
		return
	}
	local, err := n.store.ListDeadLetters(r.Context(), ns, after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	all := viewsOf(local, n.name)
	var mu sync.Mutex
	q := url.Values{"after": {after}, "limit": {strconv.Itoa(limit)}}
	unreachable := n.fanOut(r.Context(), func(ctx context.Context, m peerRef) error {
		var resp deadLettersResp
		if err := n.peers.call(ctx, http.MethodGet, m.addr, "/internal/v1/namespaces/"+ns+"/dead-letters?"+q.Encode(), nil, &resp); err != nil {
			return err
		}
		mu.Lock()
		all = append(all, resp.Rows...)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(all, func(a, b RowView) int { return strings.Compare(a.DispatchKey, b.DispatchKey) })
	out := deadLettersResp{Rows: all}
	if len(all) >= limit {
		out.Rows = all[:limit]
		out.Next = out.Rows[limit-1].DispatchKey
	}
	writeJSON(w, http.StatusOK, map[string]any{"rows": out.Rows, "next": out.Next, "unreachable_nodes": unreachable})
}

func (n *Node) handleInternalRedrive(w http.ResponseWriter, r *http.Request) {
	var req redriveReq
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	count, err := n.store.Redrive(r.Context(), r.PathValue("ns"), req.Keys, time.Now().UTC())
	if err != nil {
		writeError(w, err)
		return
	}
	n.disp.Wake()
	writeJSON(w, http.StatusOK, redriveResp{Redriven: count})
}

// handleRedrive moves dead letters (all of the namespace's, or the listed
// keys) back to pending with attempt 1, on every node.
func (n *Node) handleRedrive(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	var req redriveReq
	if r.ContentLength != 0 {
		if err := decodeBody(w, r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	for i, k := range req.Keys {
		if k == "" || len(k) > MaxKeyBytes {
			writeError(w, fieldError("keys["+strconv.Itoa(i)+"]", "must be 1-%d bytes", MaxKeyBytes))
			return
		}
	}
	total, err := n.store.Redrive(r.Context(), ns, req.Keys, time.Now().UTC())
	if err != nil {
		writeError(w, err)
		return
	}
	var mu sync.Mutex
	unreachable := n.fanOut(r.Context(), func(ctx context.Context, m peerRef) error {
		var resp redriveResp
		if err := n.peers.call(ctx, http.MethodPost, m.addr, "/internal/v1/namespaces/"+ns+"/dead-letters/redrive", req, &resp); err != nil {
			return err
		}
		mu.Lock()
		total += resp.Redriven
		mu.Unlock()
		return nil
	})
	n.disp.Wake()
	writeJSON(w, http.StatusOK, map[string]any{"redriven": total, "unreachable_nodes": unreachable})
}

type peerRef struct{ name, addr string }

// peerCallTimeout bounds one peer's part of a fanned-out admin call.
const peerCallTimeout = 5 * time.Second

// fanOut calls fn for every other member concurrently, each bounded by
// peerCallTimeout, and returns the names of the members whose call failed,
// sorted.
func (n *Node) fanOut(ctx context.Context, fn func(ctx context.Context, m peerRef) error) []string {
	var (
		mu          sync.Mutex
		wg          sync.WaitGroup
		unreachable = []string{} // JSON [] rather than null
	)
	for _, m := range n.peerMembers() {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
			defer cancel()
			if err := fn(cctx, m); err != nil {
				n.log.Warn("peer call failed", "peer", m.name, "err", err)
				mu.Lock()
				unreachable = append(unreachable, m.name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(unreachable)
	return unreachable
}

func (n *Node) peerMembers() []peerRef {
	var out []peerRef
	for _, m := range n.ownership().Members {
		if m.Name != n.name && m.APIAddr != "" {
			out = append(out, peerRef{m.Name, m.APIAddr})
		}
	}
	return out
}

// ---- cluster views ----

type memberView struct {
	Name               string  `json:"name"`
	APIAddr            string  `json:"api_addr"`
	State              string  `json:"state"`
	OwnedShards        int     `json:"owned_shards"`
	OwnedShardFraction float64 `json:"owned_shard_fraction"`
}

func (n *Node) handleCluster(w http.ResponseWriter, r *http.Request) {
	snap := n.ownership()
	members := make([]memberView, 0, len(snap.Members))
	for _, m := range snap.Members {
		owned := snap.Table.OwnedCount(m.Name)
		members = append(members, memberView{Name: m.Name, APIAddr: m.APIAddr, State: string(m.State),
			OwnedShards: owned, OwnedShardFraction: float64(owned) / float64(snap.ShardCount)})
	}
	// Shards with rows in transfer (on the wire, or left marked by a failed
	// release) are still listed: their rows are here until the owner acks.
	foreign, _ := n.store.ForeignShards(r.Context())
	pending := len(foreign)
	writeJSON(w, http.StatusOK, map[string]any{
		"node":              n.name,
		"shard_count":       snap.ShardCount,
		"ownership_version": snap.Version,
		"members":           members,
		"handoff": map[string]any{
			"shards_pending": pending,
		},
	})
}

func (n *Node) handleShards(w http.ResponseWriter, _ *http.Request) {
	snap := n.ownership()
	type shardView struct {
		Shard uint32 `json:"shard"`
		Owner string `json:"owner"`
	}
	out := make([]shardView, snap.ShardCount)
	for s := range snap.ShardCount {
		out[s] = shardView{Shard: s, Owner: snap.Table.Owner(s)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"shard_count": snap.ShardCount, "ownership_version": snap.Version, "shards": out})
}

// isNull reports whether a decoded field was JSON null (the decoder may
// hand a custom type either "null" or nothing for it).
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
