package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the node's own metrics (the store, cluster and
// dispatcher register theirs on the same registry).
type nodeMetrics struct {
	appendRows           *prometheus.CounterVec // by outcome
	appendRequests       *prometheus.CounterVec // by code class
	forwardErrors        prometheus.Counter
	handoffSent          prometheus.Counter
	handoffReceived      prometheus.Counter
	handoffErrors        prometheus.Counter
	handoffShardsPending prometheus.Gauge
	handoffInTransfer    prometheus.Gauge
	pending              *prometheus.GaugeVec
	oldestPendingAge     *prometheus.GaugeVec
	deadLetters          *prometheus.GaugeVec
}

func newNodeMetrics(reg prometheus.Registerer) *nodeMetrics {
	m := &nodeMetrics{
		appendRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_append_rows_total", Help: "Rows answered by POST /v1/rows on this node, by outcome (created, duplicate, accepted).",
		}, []string{"outcome"}),
		appendRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_append_requests_total", Help: "POST /v1/rows requests by HTTP status code.",
		}, []string{"code"}),
		forwardErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_forward_errors_total", Help: "Forwarded appends that failed; their rows were held here and answered accepted.",
		}),
		handoffSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_handoff_rows_sent_total", Help: "Rows handed off to their shard owner and deleted here.",
		}),
		handoffReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_handoff_rows_received_total", Help: "Rows received by handoff from other nodes (merged or deduplicated).",
		}),
		handoffErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_handoff_errors_total", Help: "Handoff batches that failed and were unmarked for a later retry.",
		}),
		handoffShardsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_handoff_shards_pending", Help: "Non-owned shards that still hold pending or finished rows on this node (in transfer or not).",
		}),
		handoffInTransfer: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_handoff_rows_in_transfer", Help: "Rows marked in-transfer on this node (on the wire to their owner, or left by a failed release being retried): not claimable here.",
		}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_pending_rows", Help: "Pending rows held on this node, by namespace.",
		}, []string{"namespace"}),
		oldestPendingAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_oldest_pending_age_seconds", Help: "Age of the oldest visible pending row on this node (now − visible_after), by namespace; 0 when none.",
		}, []string{"namespace"}),
		deadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_dead_letter_rows", Help: "Failed rows (dead letters) held on this node, by namespace.",
		}, []string{"namespace"}),
	}
	reg.MustRegister(m.appendRows, m.appendRequests, m.forwardErrors, m.handoffSent, m.handoffReceived,
		m.handoffErrors, m.handoffShardsPending, m.handoffInTransfer, m.pending, m.oldestPendingAge, m.deadLetters)
	return m
}

// statsLoop refreshes the per-namespace backlog gauges from the store's
// maintained counters once a second.
func (n *Node) statsLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if marked, err := n.store.MarkedRows(ctx); err == nil {
			n.m.handoffInTransfer.Set(float64(marked))
		}
		stats, err := n.store.NamespaceStats(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for ns := range seen {
			if _, ok := stats[ns]; !ok {
				n.m.pending.DeleteLabelValues(ns)
				n.m.oldestPendingAge.DeleteLabelValues(ns)
				n.m.deadLetters.DeleteLabelValues(ns)
				delete(seen, ns)
			}
		}
		for ns, st := range stats {
			seen[ns] = true
			n.m.pending.WithLabelValues(ns).Set(float64(st.Pending))
			n.m.deadLetters.WithLabelValues(ns).Set(float64(st.Failed))
			age := 0.0
			if !st.OldestPending.IsZero() && st.OldestPending.Before(now) {
				age = now.Sub(st.OldestPending).Seconds()
			}
			n.m.oldestPendingAge.WithLabelValues(ns).Set(age)
		}
	}
}
