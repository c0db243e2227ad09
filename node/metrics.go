package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// statsMetrics are the node's backlog gauges, refreshed from the store by
// the stats service (the API, router, handoff, store, cluster and
// dispatcher register their own metrics on the same registry).
type statsMetrics struct {
	handoffInTransfer prometheus.Gauge
	pending           *prometheus.GaugeVec
	oldestPendingAge  *prometheus.GaugeVec
	deadLetters       *prometheus.GaugeVec
}

func newStatsMetrics(reg prometheus.Registerer) (*statsMetrics, error) {
	m := &statsMetrics{
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
	for _, c := range []prometheus.Collector{m.handoffInTransfer, m.pending, m.oldestPendingAge, m.deadLetters} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// statsLoop refreshes the per-namespace backlog gauges from the store's
// maintained counters once a second.
func (n *Node) statsLoop(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	m := n.stats
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if marked, err := n.store.MarkedRows(ctx); err == nil {
			m.handoffInTransfer.Set(float64(marked))
		}
		stats, err := n.store.NamespaceStats(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for ns := range seen {
			if _, ok := stats[ns]; !ok {
				m.pending.DeleteLabelValues(ns)
				m.oldestPendingAge.DeleteLabelValues(ns)
				m.deadLetters.DeleteLabelValues(ns)
				delete(seen, ns)
			}
		}
		for ns, st := range stats {
			seen[ns] = true
			m.pending.WithLabelValues(ns).Set(float64(st.Pending))
			m.deadLetters.WithLabelValues(ns).Set(float64(st.Failed))
			age := 0.0
			if !st.OldestPending.IsZero() && st.OldestPending.Before(now) {
				age = now.Sub(st.OldestPending).Seconds()
			}
			m.oldestPendingAge.WithLabelValues(ns).Set(age)
		}
	}
}
