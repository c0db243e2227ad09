package kv

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Store's Prometheus metrics (PITFALLS: fairshard_ prefix,
// base units, _total counters, no label per key or node). The names keep
// the "cluster_config" of the package this one came out of.
//
//	fairshard_cluster_config_entries                        gauge     live (not deleted) entries
//	fairshard_cluster_config_tombstones                     gauge     tombstones held
//	fairshard_cluster_config_state_bytes                    gauge     encoded size of the full state a push/pull sends
//	fairshard_cluster_config_updates_total{source}          counter   accepted changes: local writes, remote (gossip, push/pull)
//	fairshard_cluster_config_tombstones_collected_total{reason} counter acked, ttl, cap (see Collect)
//	fairshard_cluster_config_writes_refused_total{limit}    counter   writes refused at a cap: entries, bytes
//	fairshard_cluster_config_persist_errors_total           counter   failed attempts to persist a change (each is retried)
//	fairshard_cluster_config_persist_pending                gauge     keys whose change is not yet durable here
//	fairshard_cluster_config_state_sent_bytes               histogram size of each full state sent by push/pull
//	fairshard_gossip_messages_dropped_total{reason}         counter   config gossip dropped: decode, protocol_version
type metrics struct {
	entries       prometheus.Gauge
	tombstones    prometheus.Gauge
	stateBytes    prometheus.Gauge
	updates       *prometheus.CounterVec
	collected     *prometheus.CounterVec
	refusedW      *prometheus.CounterVec
	persistErrors prometheus.Counter
	pending       prometheus.Gauge
	stateSent     prometheus.Histogram
	dropped       *prometheus.CounterVec

	reg        prometheus.Registerer
	registered []prometheus.Collector
}

func newMetrics(s *Store, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_cluster_config_entries",
			Help: "Live (not deleted) entries of the gossiped cluster config.",
		}),
		tombstones: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_cluster_config_tombstones",
			Help: "Tombstones (deleted entries not yet collected) of the gossiped cluster config.",
		}),
		stateBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_cluster_config_state_bytes",
			Help: "Encoded size of this node's full cluster config state, as a push/pull sends it; memberlist refuses more than 20 MiB.",
		}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_cluster_config_updates_total",
			Help: "Accepted cluster config changes by source: local writes or remote (gossip, push/pull).",
		}, []string{"source"}),
		collected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_cluster_config_tombstones_collected_total",
			Help: "Tombstones collected: acked (every member had seen them), ttl (older than the tombstone TTL), cap (over the tombstone cap, oldest first).",
		}, []string{"reason"}),
		refusedW: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_cluster_config_writes_refused_total",
			Help: "Cluster config writes refused because they would pass a cap: entries or bytes.",
		}, []string{"limit"}),
		persistErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_cluster_config_persist_errors_total",
			Help: "Failed attempts to persist a remote cluster config change; each is retried until it succeeds.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_cluster_config_persist_pending",
			Help: "Cluster config keys whose latest change is not yet durable on this node.",
		}),
		// Buckets from 1 KiB to 16 MiB (×4): the top buckets sit next to
		// memberlist's 20 MiB refusal.
		stateSent: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fairshard_cluster_config_state_sent_bytes",
			Help:    "Size of each full cluster config state this node sent in a push/pull.",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 8),
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_gossip_messages_dropped_total",
			Help: "Cluster config gossip messages dropped because they could not be decoded or came from another protocol version. Hopefully 0.",
		}, []string{"reason"}),
	}
	for _, l := range []string{"local", "remote"} {
		m.updates.WithLabelValues(l)
	}
	for _, l := range []string{"acked", "ttl", "cap"} {
		m.collected.WithLabelValues(l)
	}
	for _, l := range []string{"entries", "bytes"} {
		m.refusedW.WithLabelValues(l)
	}
	for _, l := range []string{"decode", "protocol_version"} {
		m.dropped.WithLabelValues(l)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m.reg = reg
	for _, col := range []prometheus.Collector{m.entries, m.tombstones, m.stateBytes, m.updates, m.collected,
		m.refusedW, m.persistErrors, m.pending, m.stateSent, m.dropped} {
		if err := reg.Register(col); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register kv metrics: %w (is another Store using this Registerer?)", err)
			}
			return nil, fmt.Errorf("register kv metrics: %w", err)
		}
		m.registered = append(m.registered, col)
	}
	return m, nil
}

// sync copies the store's figures into the gauges (s.mu held).
func (m *metrics) sync(s *Store) {
	if m == nil {
		return
	}
	m.entries.Set(float64(s.live))
	m.tombstones.Set(float64(s.tomb))
	m.stateBytes.Set(float64(s.stateBytes()))
	m.pending.Set(float64(len(s.pending)))
}

func (m *metrics) refused(err error) {
	var le *LimitError
	if errors.As(err, &le) {
		m.refusedW.WithLabelValues(le.Limit).Inc()
	}
}

func (m *metrics) unregister() {
	for _, col := range m.registered {
		m.reg.Unregister(col)
	}
	m.registered = nil
}
