package httpapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// An operator's read-back and list routes: targets and holds read back, the
// row listing, cancel, dead-letter purge, and the namespace views'
// cluster-wide totals. Writes that concern rows go to the node holding
// them; lists are fanned out to every member and name the members that did
// not answer.

// ConsoleStore is what the read-back needs of the node's store beside the
// rest of Store (outboxtest.ConsoleReader checks both stores).
type ConsoleStore interface {
	Cancel(ctx context.Context, p outbox.CancelParams) (bool, error)
	Attempts(ctx context.Context, dispatchKey string) ([]outbox.Attempt, error)
	ListRows(ctx context.Context, q outbox.RowQuery) (outbox.RowPage, error)
	PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	// PendingRoutes lists the routes with visible pending rows of owned
	// shards (which namespaces want a target host, for a row's
	// explanation).
	PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error)
}

// Limits of the read-back.
const (
	maxRowPage     = 1000
	defaultRowPage = 100
)

// consoleRoutes registers the read-back routes.
func (a *API) consoleRoutes(pub, internal func(string, http.HandlerFunc)) {
	pub("GET /v1/targets", a.handleListTargets)
	pub("GET /v1/namespaces/{ns}/task-queues/{tq}/target", a.handleGetTarget)
	pub("GET /v1/holds", a.handleListHolds)
	pub("GET /v1/workflows/{wf}/hold", a.handleGetHold)
	pub("GET /v1/namespaces/{ns}/rows", a.handleListRows)
	pub("POST /v1/rows/cancel", a.handleCancel)
	pub("POST /v1/namespaces/{ns}/dead-letters/purge", a.handlePurge)

}

// ---- targets and holds ----

// routeTargetView is a route's own target as read back.
func routeTargetView(ns, tq string, t settings.TargetSettings) api.TargetView {
	r := t.Redacted()
	return api.TargetView{Namespace: ns, TaskQueue: tq, URL: RedactURL(r.URL), TimeoutMS: r.TimeoutMS,
		SigningSecretFingerprints: r.SigningSecretFingerprints, HeaderNames: r.HeaderNames, Source: "route"}
}

func (a *API) handleListTargets(w http.ResponseWriter, _ *http.Request) {
	out := api.TargetList{Targets: []api.TargetView{}, DefaultTarget: RedactURL(a.cfg.Settings.DefaultTarget())}
	for _, t := range a.cfg.Settings.Targets() {
		out.Targets = append(out.Targets, routeTargetView(t.Namespace, t.TaskQueue, t.TargetSettings))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

func (a *API) handleGetTarget(w http.ResponseWriter, r *http.Request) {
	ns, tq, err := routeFromPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if t, ok := a.cfg.Settings.OwnTarget(ns, tq); ok {
		httperr.WriteJSON(w, http.StatusOK, routeTargetView(ns, tq, t))
		return
	}
	if d := a.cfg.Settings.DefaultTarget(); d != "" {
		httperr.WriteJSON(w, http.StatusOK, api.TargetView{Namespace: ns, TaskQueue: tq, URL: RedactURL(d), Source: "default"})
		return
	}
	writeError(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound,
		Message: fmt.Sprintf("route %s/%s has no target and the node no --default-target: its rows wait", ns, tq)})
}

type holdView struct {
	WorkflowID string `json:"workflow_id"`
	Held       bool   `json:"held"`
}

func (a *API) handleListHolds(w http.ResponseWriter, _ *http.Request) {
	out := []holdView{}
	for _, h := range a.cfg.Settings.Holds() {
		out = append(out, holdView{WorkflowID: h.WorkflowID, Held: true})
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"holds": out})
}

func (a *API) handleGetHold(w http.ResponseWriter, r *http.Request) {
	wf, err := holdWorkflow(r)
	if err != nil {
		writeError(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, holdView{WorkflowID: wf, Held: a.cfg.Settings.IsHeld(wf)})
}

// redacted replaces a secret in a read-back URL.
const redacted = "REDACTED"

// secretParams are query parameter names (lower case, or parts of them)
// whose values RedactURL hides.
var secretParams = []string{"token", "key", "secret", "sig", "password", "passwd", "pass", "auth", "credential", "code"}

// RedactURL returns a target URL template as the read-back shows it: a
// password in the userinfo and the values of query parameters whose name
// suggests a secret (token, key, secret, sig, password, auth, credential,
// code…) are replaced by "REDACTED"; the {namespace} and {task_queue}
// placeholders stay as written. A URL that does not parse is answered
// "REDACTED" whole. "" stays "".
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return redacted
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			lk := strings.ToLower(k)
			for _, s := range secretParams {
				if strings.Contains(lk, s) {
					for i := range vs {
						vs[i] = redacted
					}
					break
				}
			}
		}
		u.RawQuery = q.Encode()
	}
	return strings.NewReplacer("%7B", "{", "%7D", "}").Replace(u.String())
}

// ---- row listing (fanned out) ----

// rowQuery reads a listing's filters and page from the query string.
func rowQuery(ns string, v url.Values) (outbox.RowQuery, error) {
	var err error
	q := outbox.RowQuery{Namespace: ns, TaskQueue: v.Get("task_queue"), WorkflowID: v.Get("workflow_id"),
		Status: outbox.Status(v.Get("status")), After: v.Get("after"), Limit: defaultRowPage}
	if q.TaskQueue != "" && !ValidName(q.TaskQueue) {
		return q, httperr.Field("task_queue", "%q must be 1-64 letters, digits, '-', '_' or '.'", q.TaskQueue)
	}
	if len(q.WorkflowID) > MaxWorkflowIDBytes {
		return q, httperr.Field("workflow_id", "must be at most %d bytes", MaxWorkflowIDBytes)
	}
	if q.Status != "" && !q.Status.Valid() {
		return q, httperr.Field("status", "must be one of pending, claimed, done, failed, cancelled")
	}
	if len(q.After) > MaxKeyBytes {
		return q, httperr.Field("after", "must be at most %d bytes", MaxKeyBytes)
	}
	if s := v.Get("limit"); s != "" {
		q.Limit, err = strconv.Atoi(s)
		if err != nil || q.Limit < 1 || q.Limit > maxRowPage {
			return q, httperr.Field("limit", "must be an integer from 1 to %d", maxRowPage)
		}
	}
	return q, nil
}

// localRows is this node's page of a listing (its UnreachableNodes
// empty).
func (a *API) localRows(ctx context.Context, q outbox.RowQuery) (api.RowPage, error) {
	p, err := a.cfg.Store.ListRows(ctx, q)
	if err != nil {
		return api.RowPage{}, err
	}
	return api.RowPage{Rows: peer.ViewsOf(p.Rows, a.cfg.Self), Next: p.Next}, nil
}

// handleListRows lists a namespace's rows (filtered by task_queue,
// workflow_id, status) across the cluster, ordered by dispatch_key; "next"
// is the cursor for ?after=.
func (a *API) handleListRows(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	q, err := rowQuery(ns, r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	local, err := a.localRows(r.Context(), q)
	if err != nil {
		writeError(w, err)
		return
	}
	pages := []api.RowPage{local}
	var mu sync.Mutex
	query := r.URL.Query()
	unreachable := a.fanOut(r.Context(), peerReadTimeout, func(ctx context.Context, m peerRef) error {
		p, err := a.cfg.Peers.Rows(ctx, m.addr, q.Namespace, query)
		if err != nil {
			return err
		}
		mu.Lock()
		pages = append(pages, p)
		mu.Unlock()
		return nil
	})
	out := mergeRowPages(pages, q.Limit)
	out.UnreachableNodes = unreachable
	httperr.WriteJSON(w, http.StatusOK, out)
}

// mergeRowPages merges the nodes' pages of one listing: every node has
// examined its rows up to its Next (all of them when Next is ""), so the
// merged page holds the rows up to the smallest Next, at most limit, and
// its cursor is the last row kept, or that smallest Next.
func mergeRowPages(pages []api.RowPage, limit int) api.RowPage {
	cut, bounded := "", false
	var all []api.Row
	for _, p := range pages {
		all = append(all, p.Rows...)
		if p.Next != "" && (!bounded || p.Next < cut) {
			cut, bounded = p.Next, true
		}
	}
	slices.SortFunc(all, func(x, y api.Row) int { return strings.Compare(x.DispatchKey, y.DispatchKey) })
	all = slices.CompactFunc(all, func(x, y api.Row) bool { return x.DispatchKey == y.DispatchKey })
	out := api.RowPage{Rows: []api.Row{}}
	for _, v := range all {
		if bounded && v.DispatchKey > cut {
			break
		}
		out.Rows = append(out.Rows, v)
	}
	switch {
	case len(out.Rows) > limit:
		out.Rows = out.Rows[:limit]
		out.Next = out.Rows[limit-1].DispatchKey
	case bounded:
		out.Next = cut
	}
	return out
}

// ---- cancel ----

// maxCancelReasonBytes bounds a cancel's reason (stored as last_error).
const maxCancelReasonBytes = 256

func (a *API) decodeCancel(w http.ResponseWriter, r *http.Request) (peer.CancelRequest, error) {
	var req peer.CancelRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return req, err
	}
	return req, checkCancel(req)
}

// checkCancel refuses a cancel whose dispatch_key or reason is out of
// bounds.
func checkCancel(req peer.CancelRequest) error {
	if req.DispatchKey == "" || len(req.DispatchKey) > MaxKeyBytes {
		return httperr.Field("dispatch_key", "must be 1-%d bytes", MaxKeyBytes)
	}
	return checkText("reason", req.Reason, maxCancelReasonBytes)
}

// cancelLocal cancels the row here if this node holds it; found says it
// does.
func (a *API) cancelLocal(ctx context.Context, req peer.CancelRequest) (res api.CancelResult, found bool, err error) {
	res = api.CancelResult{DispatchKey: req.DispatchKey}
	if _, err := a.cfg.Store.Get(ctx, req.DispatchKey); errors.Is(err, outbox.ErrNotFound) {
		return res, false, nil
	} else if err != nil {
		return res, false, err
	}
	reason := cmp.Or(req.Reason, "cancelled by an operator")
	// The store ships the cancel to the backups (a failover must not
	// deliver the row), whatever happens to the read-back below.
	ok, err := a.cfg.Store.Cancel(ctx, outbox.CancelParams{DispatchKey: req.DispatchKey, Reason: reason, Now: time.Now().UTC()})
	if err != nil {
		return res, true, err
	}
	row, err := a.cfg.Store.Get(ctx, req.DispatchKey)
	if err != nil {
		return res, true, err
	}
	v := a.lookupView(ctx, row)
	res.Cancelled, res.Row = ok, &v
	if ok {
		res.Message = "cancelled on " + a.cfg.Self + ": the row will not be delivered"
	} else {
		res.Message = fmt.Sprintf("not cancelled: the row is %s on %s (only pending rows can be cancelled)", row.Status, a.cfg.Self)
	}
	return res, true, nil
}

// handleCancel cancels a pending row wherever it is held: the shard's
// owner first, then this node, then every other member (like a lookup).
func (a *API) handleCancel(w http.ResponseWriter, r *http.Request) {
	req, err := a.decodeCancel(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	snap := a.cfg.Ownership()
	var order []string
	addrs := map[string]string{}
	if owner, ok := snap.Owner(shards.ShardOf(req.DispatchKey, a.cfg.ShardCount)); ok {
		order = append(order, owner.Name)
		addrs[owner.Name] = owner.APIAddr
	}
	if !slices.Contains(order, a.cfg.Self) {
		order = append(order, a.cfg.Self)
	}
	for _, m := range snap.Members {
		if !slices.Contains(order, m.Name) && m.APIAddr != "" {
			order = append(order, m.Name)
			addrs[m.Name] = m.APIAddr
		}
	}
	for _, name := range order {
		if name == a.cfg.Self {
			res, found, err := a.cancelLocal(r.Context(), req)
			if err != nil {
				writeError(w, err)
				return
			}
			if found {
				a.cfg.Dispatcher.Wake()
				httperr.WriteJSON(w, http.StatusOK, res)
				return
			}
			continue
		}
		cctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		res, err := a.cfg.Peers.Cancel(cctx, addrs[name], req)
		cancel()
		if err == nil {
			httperr.WriteJSON(w, http.StatusOK, res)
			return
		}
	}
	writeError(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: fmt.Sprintf("no row with dispatch_key %q on any node", req.DispatchKey)})
}

// ---- dead-letter purge (fanned out) ----

func (a *API) decodePurge(w http.ResponseWriter, r *http.Request) (peer.DeadLetterKeys, error) {
	var req peer.DeadLetterKeys
	if r.ContentLength != 0 {
		if err := httperr.DecodeJSON(w, r, &req); err != nil {
			return req, err
		}
	}
	return req, checkPurgeKeys(req.Keys)
}

// checkPurgeKeys refuses a purge naming an empty or oversized key.
func checkPurgeKeys(keys []string) error {
	for i, k := range keys {
		if k == "" || len(k) > MaxKeyBytes {
			return httperr.Field("keys["+strconv.Itoa(i)+"]", "must be 1-%d bytes", MaxKeyBytes)
		}
	}
	return nil
}

// handlePurge purges dead letters (all of the namespace's, or the listed
// keys) on every node, each by its shard's primary (purgePrimary): they
// become cancelled tombstones, on the backups too.
func (a *API) handlePurge(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	req, err := a.decodePurge(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	total, err := a.purgePrimary(r.Context(), ns, req.Keys)
	if err != nil {
		writeError(w, err)
		return
	}
	var mu sync.Mutex
	unreachable := a.fanOut(r.Context(), peerCallTimeout, func(ctx context.Context, m peerRef) error {
		n, err := a.cfg.Peers.Purge(ctx, m.addr, ns, req)
		if err != nil {
			return err
		}
		mu.Lock()
		total += n
		mu.Unlock()
		return nil
	})
	httperr.WriteJSON(w, http.StatusOK, api.PurgeResult{Purged: total, UnreachableNodes: unreachable})
}

// ---- namespace views with cluster-wide totals ----

// localStats reads this node's counts and delivery metrics per namespace.
func (a *API) localStats(ctx context.Context) (peer.NodeStats, map[string]outbox.NamespaceStats, error) {
	st, err := a.cfg.Store.NamespaceStats(ctx)
	if err != nil {
		return peer.NodeStats{}, nil, err
	}
	out := peer.NodeStats{Node: a.cfg.Self, Namespaces: map[string]api.NodeNamespaceStats{}}
	for ns, s := range st {
		out.Namespaces[ns] = api.NodeNamespaceStats{Node: a.cfg.Self, Pending: s.Pending, Claimed: s.Claimed, DeadLetters: s.Failed}
	}
	for _, mf := range a.deliveryMetrics() {
		switch mf.GetName() {
		case "fairshard_rows_delivered_total":
			for _, m := range mf.GetMetric() {
				ns := nsLabel(m)
				v := out.Namespaces[ns]
				v.Node = a.cfg.Self
				v.DeliveredTotal += uint64(m.GetCounter().GetValue())
				out.Namespaces[ns] = v
			}
		case "fairshard_delivery_duration_seconds":
			for _, m := range mf.GetMetric() {
				ns := nsLabel(m)
				v := out.Namespaces[ns]
				v.Node = a.cfg.Self
				v.DeliveryP99Seconds = histogramQuantile(m.GetHistogram(), 0.99)
				out.Namespaces[ns] = v
			}
		}
	}
	delete(out.Namespaces, "")
	return out, st, nil
}

// deliveryMetricsTTL is how long the delivery figures read from the
// node's metrics are reused: a full Gather costs milliseconds, and a
// console refreshing every second from many tabs would pay it per call.
const deliveryMetricsTTL = time.Second

// deliveryMetrics returns the metric families the namespace views read
// (delivered rows, delivery durations), gathered at most once per
// deliveryMetricsTTL.
func (a *API) deliveryMetrics() []*dto.MetricFamily {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	if time.Since(a.statsAt) < deliveryMetricsTTL {
		return a.statsMFs
	}
	mfs, err := a.cfg.Gatherer.Gather()
	if err != nil {
		a.log.Warn("namespace stats: gathering metrics failed; delivery figures left at 0", "err", err)
	}
	keep := mfs[:0]
	for _, mf := range mfs {
		if n := mf.GetName(); n == "fairshard_rows_delivered_total" || n == "fairshard_delivery_duration_seconds" {
			keep = append(keep, mf)
		}
	}
	a.statsMFs, a.statsAt = keep, time.Now()
	return keep
}

func nsLabel(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "namespace" {
			return l.GetValue()
		}
	}
	return ""
}

// histogramQuantile is the upper bound of the bucket holding quantile q of
// h's observations (the largest finite bound when it is in +Inf), 0 for
// an empty histogram.
func histogramQuantile(h *dto.Histogram, q float64) float64 {
	n := h.GetSampleCount()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	last := 0.0
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		last = b.GetUpperBound()
		if b.GetCumulativeCount() >= rank {
			return last
		}
	}
	return last
}

// readBackBudget bounds the peer calls of a namespace read-back (GET
// /v1/namespaces and GET /v1/namespaces/{ns}) as a whole: the members'
// stats and the coordinator's lease status are asked at once, and those
// that have not answered when it runs out are named (unreachable_nodes,
// lease.cluster_error), so the answer comes within it plus this node's
// own work even while a member is paused or cut off (DESIGN.md "Fencing
// paused processes": a paused member must not hold up the others).
const readBackBudget = 1500 * time.Millisecond

// clusterStats gathers every member's stats: this node's, then the peers'
// (fanned out), and the members that did not answer.
func (a *API) clusterStats(ctx context.Context) ([]peer.NodeStats, map[string]outbox.NamespaceStats, []string, error) {
	local, st, err := a.localStats(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	all, unreachable := a.peerStats(ctx, local)
	return all, st, unreachable, nil
}

// peerStats fans out for the peers' stats; it returns them with local,
// sorted by node, and the members that did not answer.
func (a *API) peerStats(ctx context.Context, local peer.NodeStats) ([]peer.NodeStats, []string) {
	all := []peer.NodeStats{local}
	var mu sync.Mutex
	unreachable := a.fanOut(ctx, peerReadTimeout, func(ctx context.Context, m peerRef) error {
		s, err := a.cfg.Peers.Stats(ctx, m.addr)
		if err != nil {
			return err
		}
		mu.Lock()
		all = append(all, s)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(all, func(x, y peer.NodeStats) int { return strings.Compare(x.Node, y.Node) })
	return all, unreachable
}

func totalsOf(ns string, all []peer.NodeStats, unreachable []string) api.NamespaceTotals {
	t := api.NamespaceTotals{Nodes: []api.NodeNamespaceStats{}, UnreachableNodes: unreachable}
	for _, s := range all {
		n := s.Namespaces[ns]
		n.Node = s.Node
		t.Pending += n.Pending
		t.Claimed += n.Claimed
		t.DeadLetters += n.DeadLetters
		t.DeliveredTotal += n.DeliveredTotal
		t.Nodes = append(t.Nodes, n)
	}
	return t
}

func (a *API) handleGetNamespaceCluster(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readBackBudget)
	defer cancel()
	local, st, err := a.localStats(ctx)
	if err != nil {
		writeError(w, err)
		return
	}
	// The coordinator's lease status and the peers' stats at once, under
	// one budget.
	var nv namespaceView
	var wg sync.WaitGroup
	wg.Go(func() { nv = a.namespaceView(ctx, ns, st[ns], true) })
	all, unreachable := a.peerStats(ctx, local)
	wg.Wait()
	totals := totalsOf(ns, all, unreachable)
	nv.Cluster = &totals
	httperr.WriteJSON(w, http.StatusOK, nv)
}

func (a *API) handleListNamespacesCluster(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readBackBudget)
	defer cancel()
	all, st, unreachable, err := a.clusterStats(ctx)
	if err != nil {
		writeError(w, err)
		return
	}
	names := map[string]bool{}
	for _, s := range all {
		for ns := range s.Namespaces {
			names[ns] = true
		}
	}
	for ns := range a.cfg.Settings.Namespaces() {
		names[ns] = true
	}
	out := make([]namespaceView, 0, len(names))
	for _, ns := range slices.Sorted(maps.Keys(names)) {
		v, totals := a.namespaceView(r.Context(), ns, st[ns], false), totalsOf(ns, all, unreachable)
		v.Cluster = &totals
		out = append(out, v)
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"namespaces": out, "unreachable_nodes": unreachable})
}
