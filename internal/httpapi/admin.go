package httpapi

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
)

// Limits of the admin API (settings checks gossiped values against the
// same bounds).
const (
	MaxQuota         = settings.MaxQuota
	MaxTargetTimeout = settings.MaxTargetTimeout
	// MaxTargetURLBytes keeps a target within the gossiped config's 1 KiB
	// value limit, JSON envelope included (with signing secrets and
	// headers, the whole target must fit: checkCredentials).
	MaxTargetURLBytes = settings.MaxTargetURLBytes
	maxDeadLetterPage = 1000
)

// namespaceView is a namespace as the API shows it (api.Namespace) plus,
// in exact mode, its lease: this node's grant, wants, the coordinator and
// the lease expiry, and (GET of one namespace) the coordinator's view of
// every node.
type namespaceView struct {
	api.Namespace
	Lease *leaseView `json:"lease,omitempty"`
}

// namespaceView builds ns's view; withCluster also reads the lease
// coordinator's state (GET of one namespace, not the list).
func (a *API) namespaceView(ctx context.Context, ns string, st outbox.NamespaceStats, withCluster bool) namespaceView {
	s, _ := a.cfg.Settings.Namespace(ns)
	v := namespaceView{Namespace: api.Namespace{Name: ns, Paused: s.Paused, Retry: retryView(s.Retry), Node: a.cfg.Self,
		Pending: st.Pending, Claimed: st.Claimed, DeadLetters: st.Failed}}
	if s.MaxInFlight != nil {
		v.MaxInFlight = *s.MaxInFlight
	} else {
		v.MaxInFlight, v.MaxInFlightDefault = a.cfg.DefaultMaxInFlight, true
	}
	v.OwnedShardFraction = a.cfg.Ownership().Fraction.Float()
	c := a.cfg.Ceilings.Ceiling(ctx, ns)
	v.Mode, v.ModeDefault = c.Mode.String(), s.Mode == quota.ModeDefault
	v.Ceiling, v.Headroom = c.Rows, c.Headroom(st.Claimed)
	if c.Mode == quota.ModeExact {
		v.Lease = a.leaseView(ctx, ns, withCluster)
	}
	for _, r := range a.cfg.Dispatcher.RoutesWithoutTarget() {
		if r.Namespace == ns {
			v.WaitingRoutes = append(v.WaitingRoutes, r.TaskQueue)
		}
	}
	return v
}

// retryView is a stored retry override as the API shows it (nil: none).
func retryView(r *settings.RetrySettings) *api.NamespaceRetry {
	if r == nil {
		return nil
	}
	return &api.NamespaceRetry{Base: time.Duration(r.BaseMS) * time.Millisecond, Factor: r.Factor,
		Cap: time.Duration(r.CapMS) * time.Millisecond, MaxAttempts: r.MaxAttempts}
}

// handlePutNamespace sets max_in_flight, paused, retry and/or mode; absent
// fields keep their value, and only the fields present are written (each
// is its own config key), so fields set at once on different nodes all
// survive. max_in_flight, retry or mode null returns the field to the
// node's default. A namespace beyond MaxNamespaces is refused (409).
func (a *API) handlePutNamespace(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	var body map[string]json.RawMessage
	if err := httperr.DecodeJSON(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	var u settings.NamespaceUpdate
	// Fields in a fixed order, so the first bad one is the same whatever
	// the body's key order.
	for _, k := range slices.Sorted(maps.Keys(body)) {
		raw := body[k]
		switch k {
		case "max_in_flight":
			if isNull(raw) {
				u.ClearMaxInFlight = true
				continue
			}
			q, err := strconv.ParseUint(string(raw), 10, 32)
			if err != nil || q > MaxQuota {
				writeError(w, httperr.Field("max_in_flight", "must be an integer from 0 to %d (or null for the default)", MaxQuota))
				return
			}
			q32 := uint32(q)
			u.MaxInFlight = &q32
		case "paused":
			var p bool
			switch string(raw) {
			case "true":
				p = true
			case "false":
			default:
				writeError(w, httperr.Field("paused", "must be true or false"))
				return
			}
			u.Paused = &p
		case "retry":
			if isNull(raw) {
				u.ClearRetry = true
				continue
			}
			var rs settings.RetrySettings
			if err := strictUnmarshal(raw, &rs); err != nil {
				writeError(w, httperr.Field("retry", "must be an object with base_ms, factor, cap_ms, max_attempts: %v", err))
				return
			}
			if err := validateRetry(&rs); err != nil {
				writeError(w, err)
				return
			}
			u.Retry = &rs
		case "mode":
			if isNull(raw) {
				u.ClearMode = true
				continue
			}
			var m quota.Mode
			if err := json.Unmarshal(raw, &m); err != nil || m == quota.ModeDefault {
				writeError(w, httperr.Field("mode", `must be "exact" or "proportional" (or null for the node default)`))
				return
			}
			u.Mode = m
		default:
			writeError(w, httperr.Field(k, "unknown field (want max_in_flight, paused, retry, mode)"))
			return
		}
	}
	if _, configured := a.cfg.Settings.Namespace(ns); !configured && u.Adds() {
		if have := len(a.cfg.Settings.Namespaces()); have >= a.cfg.MaxNamespaces {
			writeError(w, limitExceeded("namespace", "%d namespaces have settings, the limit is %d (--max-namespaces); namespaces without settings use the node defaults", have, a.cfg.MaxNamespaces))
			return
		}
	}
	if err := a.cfg.Settings.UpdateNamespace(r.Context(), ns, u); err != nil {
		writeError(w, err)
		return
	}
	a.cfg.Dispatcher.Wake()
	stats, _ := a.cfg.Store.NamespaceStats(r.Context())
	httperr.WriteJSON(w, http.StatusOK, a.namespaceView(r.Context(), ns, stats[ns], false))
}

// validateRetry checks an override's bounds; the error names the field.
func validateRetry(r *settings.RetrySettings) error {
	switch {
	case r.BaseMS < 0 || r.BaseMS > time.Hour.Milliseconds():
		return httperr.Field("retry.base_ms", "must be between 0 (node default) and %d", time.Hour.Milliseconds())
	case r.Factor != 0 && (r.Factor < 1 || r.Factor > 10):
		return httperr.Field("retry.factor", "must be 0 (node default) or between 1 and 10")
	case r.CapMS < 0 || r.CapMS > (24*time.Hour).Milliseconds():
		return httperr.Field("retry.cap_ms", "must be between 0 (node default) and %d", (24 * time.Hour).Milliseconds())
	case r.CapMS > 0 && r.BaseMS > r.CapMS:
		return httperr.Field("retry.cap_ms", "must be at least retry.base_ms")
	case r.MaxAttempts > 1000:
		return httperr.Field("retry.max_attempts", "must be between 0 (node default) and 1000")
	}
	return nil
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

func (a *API) handlePutTarget(w http.ResponseWriter, r *http.Request) {
	ns, tq, err := routeFromPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req targetRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	t := settings.TargetSettings{URL: req.URL, TimeoutMS: req.TimeoutMS}
	if len(t.URL) > MaxTargetURLBytes {
		writeError(w, httperr.Field("url", "is %d bytes, the limit is %d", len(t.URL), MaxTargetURLBytes))
		return
	}
	if err := checkText("url", t.URL, MaxTargetURLBytes); err != nil {
		writeError(w, err)
		return
	}
	u, perr := url.Parse(strings.NewReplacer("{namespace}", "ns", "{task_queue}", "tq").Replace(t.URL))
	if t.URL == "" || perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		writeError(w, httperr.Field("url", "must be an absolute http(s) URL"))
		return
	}
	if t.TimeoutMS < 0 || settings.DurationMS(t.TimeoutMS) > MaxTargetTimeout {
		writeError(w, httperr.Field("timeout_ms", "must be between 0 (node default) and %d", MaxTargetTimeout.Milliseconds()))
		return
	}
	if err := req.checkCredentials(&t); err != nil {
		writeError(w, err)
		return
	}
	if !a.cfg.Settings.HasTarget(ns, tq) {
		if have := a.cfg.Settings.TargetCount(); have >= a.cfg.MaxTargets {
			writeError(w, limitExceeded("target", "%d routes have their own target, the limit is %d (--max-targets); use --default-target with {namespace} and {task_queue} for many routes", have, a.cfg.MaxTargets))
			return
		}
	}
	if err := a.cfg.Settings.PutTarget(r.Context(), ns, tq, t); err != nil {
		writeError(w, err)
		return
	}
	a.cfg.Dispatcher.Wake()
	httperr.WriteJSON(w, http.StatusOK, targetView{Namespace: ns, TaskQueue: tq, RedactedTarget: t.Redacted()})
}

func (a *API) handleDeleteTarget(w http.ResponseWriter, r *http.Request) {
	ns, tq, err := routeFromPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := a.cfg.Settings.DeleteTarget(r.Context(), ns, tq); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// holdWorkflow reads and validates the {wf} of a hold path.
func holdWorkflow(r *http.Request) (string, error) {
	wf := r.PathValue("wf")
	if wf == "" || len(wf) > MaxWorkflowIDBytes {
		return "", httperr.Field("workflow_id", "must be 1-%d bytes", MaxWorkflowIDBytes)
	}
	if err := checkText("workflow_id", wf, MaxWorkflowIDBytes); err != nil {
		return "", err
	}
	return wf, nil
}

func (a *API) handleHold(w http.ResponseWriter, r *http.Request) {
	wf, err := holdWorkflow(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !a.cfg.Settings.IsHeld(wf) {
		if have := a.cfg.Settings.HoldCount(); have >= a.cfg.MaxHolds {
			writeError(w, limitExceeded("hold", "%d workflows are held, the limit is %d (--max-holds); release some first", have, a.cfg.MaxHolds))
			return
		}
	}
	if err := a.cfg.Settings.Hold(r.Context(), wf); err != nil {
		writeError(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"workflow_id": r.PathValue("wf"), "held": true})
}

func (a *API) handleRelease(w http.ResponseWriter, r *http.Request) {
	wf, err := holdWorkflow(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := a.cfg.Settings.Release(r.Context(), wf); err != nil {
		writeError(w, err)
		return
	}
	a.cfg.Dispatcher.Wake()
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"workflow_id": r.PathValue("wf"), "held": false})
}

// ---- dead letters: deadletters.go (each shard's listed by its primary);
// redrive (fanned out to every member, done by each shard's primary) ----

// isPrimary reports whether this node is the primary of key's shard in
// its applied view: dead letters are listed and redriven by the primary
// of their shard only (the backups hold copies of the same rows).
func (a *API) isPrimary(key string) bool {
	return a.primaryIn(a.cfg.Ownership())(key)
}

// primaryIn returns a test of whether this node is the primary of a key's
// shard in view (one snapshot for a whole page, so its rows agree).
func (a *API) primaryIn(view *cluster.OwnershipSnapshot) func(key string) bool {
	return func(key string) bool {
		return view.ReplicaSet(shards.ShardOf(key, a.cfg.ShardCount)).Primary() == a.cfg.Self
	}
}

// primaryDeadLetters returns ns's dead letters (of keys, or all) of the
// shards this node is primary of: the ones a redrive or purge acts on
// here (the backups' copies follow by shipping).
func (a *API) primaryDeadLetters(ctx context.Context, ns string, keys []string) ([]string, error) {
	var mine []string
	if len(keys) > 0 {
		for _, k := range keys {
			if a.isPrimary(k) {
				mine = append(mine, k)
			}
		}
		return mine, nil
	}
	q := peer.DeadLetterQuery{Limit: maxDeadLetterPage, MaxBytes: MaxDeadLetterPageBytes}
	for {
		views, more, err := a.localDeadLetters(ctx, ns, q) // primaries' only
		if err != nil {
			return nil, err
		}
		for _, v := range views {
			mine = append(mine, v.DispatchKey)
		}
		if !more || len(views) == 0 {
			return mine, nil
		}
		q.After = views[len(views)-1].DispatchKey
	}
}

// redrivePrimary redrives ns's dead letters (keys, or all) of the shards
// this node is primary of (the store ships their new state to the
// backups), so a redrive counts each row once whatever the replication
// factor.
func (a *API) redrivePrimary(ctx context.Context, ns string, keys []string) (int, error) {
	mine, err := a.primaryDeadLetters(ctx, ns, keys)
	if err != nil || len(mine) == 0 {
		return 0, err
	}
	return a.cfg.Store.Redrive(ctx, ns, mine, time.Now().UTC())
}

// purgePrimary purges ns's dead letters (keys, or all) of the shards this
// node is primary of (the store ships their new state to the backups), so
// a purge counts each row once whatever the replication factor.
func (a *API) purgePrimary(ctx context.Context, ns string, keys []string) (int, error) {
	mine, err := a.primaryDeadLetters(ctx, ns, keys)
	if err != nil || len(mine) == 0 {
		return 0, err
	}
	return a.cfg.Store.PurgeDeadLetters(ctx, ns, mine, time.Now().UTC())
}

// handleRedrive moves dead letters (all of the namespace's, or the listed
// keys) back to pending with attempt 1, on every node.
func (a *API) handleRedrive(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	var req peer.DeadLetterKeys
	if r.ContentLength != 0 {
		if err := httperr.DecodeJSON(w, r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	if err := validateRedriveKeys(req.Keys); err != nil {
		writeError(w, err)
		return
	}
	total, err := a.redrivePrimary(r.Context(), ns, req.Keys)
	if err != nil {
		writeError(w, err)
		return
	}
	var mu sync.Mutex
	unreachable := a.fanOut(r.Context(), peerCallTimeout, func(ctx context.Context, m peerRef) error {
		redriven, err := a.cfg.Peers.Redrive(ctx, m.addr, ns, req)
		if err != nil {
			return err
		}
		mu.Lock()
		total += redriven
		mu.Unlock()
		return nil
	})
	a.cfg.Dispatcher.Wake()
	httperr.WriteJSON(w, http.StatusOK, api.RedriveResult{Redriven: total, UnreachableNodes: unreachable})
}

// validateRedriveKeys checks a redrive's keys (public and internal).
func validateRedriveKeys(keys []string) error {
	if len(keys) > maxDeadLetterPage*10 {
		return httperr.TooLarge("keys", "%d keys exceed the limit of %d per redrive", len(keys), maxDeadLetterPage*10)
	}
	for i, k := range keys {
		if k == "" || len(k) > MaxKeyBytes {
			return httperr.Field("keys["+strconv.Itoa(i)+"]", "must be 1-%d bytes", MaxKeyBytes)
		}
	}
	return nil
}

type peerRef struct{ name, addr string }

// peerCallTimeout bounds one peer's part of a fanned-out admin call that
// changes rows (redrive, purge) or reads pages of them (dead letters).
const peerCallTimeout = 5 * time.Second

// peerReadTimeout bounds one peer's part of a fanned-out read-back (row
// listings, namespace totals): a paused or partitioned member is named in
// unreachable_nodes after it, and the answer comes without it.
const peerReadTimeout = 2 * time.Second

// fanOut calls fn for every other member concurrently, each bounded by
// timeout, and returns the names of the members whose call failed,
// sorted.
func (a *API) fanOut(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, m peerRef) error) []string {
	return a.fanOutTo(ctx, a.peerMembers(), timeout, fn)
}

// fanOutTo is fanOut to the given members.
func (a *API) fanOutTo(ctx context.Context, peers []peerRef, timeout time.Duration, fn func(ctx context.Context, m peerRef) error) []string {
	var (
		mu          sync.Mutex
		wg          sync.WaitGroup
		unreachable = []string{} // JSON [] rather than null
	)
	for _, m := range peers {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := fn(cctx, m); err != nil {
				a.log.Warn("peer call failed", "peer", m.name, "err", err)
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

func (a *API) peerMembers() []peerRef {
	var out []peerRef
	for _, m := range a.cfg.Ownership().Members {
		if m.Name != a.cfg.Self && m.APIAddr != "" {
			out = append(out, peerRef{m.Name, m.APIAddr})
		}
	}
	return out
}

// ---- cluster views ----

func (a *API) handleCluster(w http.ResponseWriter, r *http.Request) {
	snap := a.cfg.Ownership()
	out := api.Cluster{Node: a.cfg.Self, Accepted: snap.Accepted, ShardCount: snap.ShardCount, OwnershipVersion: snap.Version,
		Members: make([]api.Member, 0, len(snap.Members)), Replication: a.cfg.Replication.Status(), Security: a.cfg.Security}
	for _, m := range snap.Members {
		owned := snap.Table.OwnedCount(m.Name)
		reachable := m.Name == a.cfg.Self || a.cfg.Reachable == nil || a.cfg.Reachable(m.Name)
		out.Members = append(out.Members, api.Member{Name: m.Name, APIAddr: m.APIAddr, GossipAddr: m.GossipAddr, GossipKeys: commaList(m.GossipKeys), State: string(m.State), Reachable: reachable,
			OwnedShards: owned, OwnedShardFraction: float64(owned) / float64(snap.ShardCount)})
	}
	if left, err := a.cfg.Replication.Leftovers(r.Context()); err == nil {
		out.Handoff.ShardsPending = len(left)
	}
	if a.cfg.Leases != nil {
		out.LeasesLearning = a.cfg.Leases.Learning()
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// clusterUpdate is PUT /v1/cluster's body.
type clusterUpdate struct {
	ReplicationFactor *int `json:"replication_factor"`
}

// handlePutCluster changes cluster-wide settings: today the replication
// factor R (1–5), kept in the gossiped config. Every node recomputes its
// replica sets when the change reaches it; raising R makes the new
// replicas sync (watch GET /v1/cluster's replication object), lowering it
// drops the extra copies once the smaller sets are synced.
func (a *API) handlePutCluster(w http.ResponseWriter, r *http.Request) {
	var u clusterUpdate
	if err := httperr.DecodeJSON(w, r, &u); err != nil {
		writeError(w, err)
		return
	}
	if u.ReplicationFactor == nil {
		writeError(w, httperr.Field("replication_factor", "is required"))
		return
	}
	if f := *u.ReplicationFactor; f < 1 || f > replication.MaxFactor {
		writeError(w, httperr.Field("replication_factor", "%d is not between 1 and %d", f, replication.MaxFactor))
		return
	}
	if err := a.cfg.SetReplicationFactor(r.Context(), *u.ReplicationFactor); err != nil {
		writeError(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"replication_factor": *u.ReplicationFactor})
}

func (a *API) handleShards(w http.ResponseWriter, _ *http.Request) {
	snap := a.cfg.Ownership()
	out := api.ShardTable{ShardCount: snap.ShardCount, OwnershipVersion: snap.Version, ReplicationFactor: snap.Factor,
		Shards: make([]api.ShardOwner, snap.ShardCount)}
	sets := snap.ReplicaSets()
	for s := range snap.ShardCount {
		reps := sets[s]
		if reps == nil {
			reps = []string{}
		}
		out.Shards[s] = api.ShardOwner{Shard: s, Owner: snap.Table.Owner(s), Replicas: reps}
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// handleShard shows one shard's replica set and each replica's sync state
// and digest, asked of the replicas now.
func (a *API) handleShard(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseUint(r.PathValue("shard"), 10, 32)
	if err != nil || uint32(n) >= a.cfg.ShardCount {
		writeError(w, httperr.Field("shard", "%q is not a shard number from 0 to %d", r.PathValue("shard"), a.cfg.ShardCount-1))
		return
	}
	st, err := a.cfg.Replication.ShardStatus(r.Context(), uint32(n))
	if err != nil {
		writeError(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, st)
}

// commaList splits a comma-separated list (a member's key fingerprints),
// never nil (JSON [] rather than null).
func commaList(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// isNull reports whether a decoded field was JSON null (the decoder may
// hand a custom type either "null" or nothing for it).
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
