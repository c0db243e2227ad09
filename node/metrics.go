package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/internal/tick"
)

// statsMetrics are the node's backlog gauges, refreshed from the store by
// the stats service (the API, router, handoff, store, cluster and
// dispatcher register their own metrics on the same registry).
type statsMetrics struct {
	handoffInTransfer prometheus.Gauge
	pending           *prometheus.GaugeVec
	oldestPendingAge  *prometheus.GaugeVec
	deadLetters       *prometheus.GaugeVec
	pauses            prometheus.Counter
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
		pauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_process_pauses_total", Help: "Times this process noticed it had not run for longer than its pause threshold (GC, VM freeze, SIGSTOP): its primary shards waited for a handover and its coordinator terms started anew.",
		}),
	}
	for _, c := range []prometheus.Collector{m.handoffInTransfer, m.pending, m.oldestPendingAge, m.deadLetters, m.pauses} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// statsLoop refreshes the per-namespace backlog gauges from the store's
// maintained counters once a second.
func (n *Node) statsLoop(ctx context.Context) error {
	seen := map[string]bool{} // the labels set so far
	return tick.Every(ctx, time.Second, func(ctx context.Context) { n.refreshStats(ctx, seen) })
}

// refreshStats is one tick of statsLoop; seen holds the namespace labels
// whose series are set (those no longer listed are deleted).
func (n *Node) refreshStats(ctx context.Context, seen map[string]bool) {
	m := n.stats
	if marked, err := n.store.MarkedRows(ctx); err == nil {
		m.handoffInTransfer.Set(float64(marked))
	}
	stats, err := n.store.NamespaceStats(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	// Namespaces past --metrics-namespaces share the "_other" series:
	// counts summed, the oldest age kept.
	type agg struct{ pending, failed, age float64 }
	byLabel := map[string]*agg{}
	for ns, st := range stats {
		l := n.nsLabels.Label(ns)
		a := byLabel[l]
		if a == nil {
			a = &agg{}
			byLabel[l] = a
		}
		a.pending += float64(st.Pending)
		a.failed += float64(st.Failed)
		if !st.OldestPending.IsZero() && st.OldestPending.Before(now) {
			a.age = max(a.age, now.Sub(st.OldestPending).Seconds())
		}
	}
	for l := range seen {
		if _, ok := byLabel[l]; !ok {
			m.pending.DeleteLabelValues(l)
			m.oldestPendingAge.DeleteLabelValues(l)
			m.deadLetters.DeleteLabelValues(l)
			delete(seen, l)
		}
	}
	for l, a := range byLabel {
		seen[l] = true
		m.pending.WithLabelValues(l).Set(a.pending)
		m.deadLetters.WithLabelValues(l).Set(a.failed)
		m.oldestPendingAge.WithLabelValues(l).Set(a.age)
	}
}
