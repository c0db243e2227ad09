package cluster

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Cluster's Prometheus metrics (PITFALLS: fairshard_ prefix,
// base units, _total counters, no label per shard, key or node).
//
//	fairshard_cluster_members{state}                 gauge   live members by declared state: active, leaving (suspects count as live)
//	fairshard_cluster_health_score                   gauge   memberlist's awareness score; 0 is healthy, higher means this node is slow to answer probes
//	fairshard_owned_shards                           gauge   shards this node owns
//	fairshard_owned_shard_fraction                   gauge   owned/shard_count, in [0, 1] (unclamped: 0 while leaving)
//	fairshard_ownership_changes_total                counter snapshots whose table differed from the previous one
//	fairshard_ownership_shards_moved_total           counter shards whose owner changed, summed over those snapshots
//	fairshard_cluster_refused_members_total{reason}  counter refused alive/merge messages: shard_count, protocol_version, bad_meta; name_conflict: a node claimed a member's name from another address (or this node was refused as a live duplicate)
//	fairshard_cluster_accepted                       gauge   1 once the cluster has accepted this node (it may own shards), 0 before (accept.go)
//
// The gossiped config's metrics (fairshard_cluster_config_*,
// fairshard_gossip_messages_dropped_total) are the kv store's, registered
// on the same Registerer (kv/metrics.go).
type metrics struct {
	ownedShards      prometheus.Gauge
	ownedFraction    prometheus.Gauge
	ownershipChanges prometheus.Counter
	shardsMoved      prometheus.Counter
	refused          *prometheus.CounterVec
	members          *membersCollector
	health           prometheus.GaugeFunc
	accepted         prometheus.GaugeFunc

	registered []prometheus.Collector
	reg        prometheus.Registerer
}

func newMetrics(c *Cluster) *metrics {
	m := &metrics{
		ownedShards: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_owned_shards",
			Help: "Shards this node owns in its current ownership snapshot.",
		}),
		ownedFraction: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_owned_shard_fraction",
			Help: "Owned shards over the shard count, in [0, 1]; 0 while the node is leaving.",
		}),
		ownershipChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_ownership_changes_total",
			Help: "Ownership snapshots whose shard table differed from the previous one.",
		}),
		shardsMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_ownership_shards_moved_total",
			Help: "Shards whose owner changed, summed over ownership changes.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_cluster_refused_members_total",
			Help: "Alive or merge messages of peers refused for an incompatible shard count, protocol version or unreadable meta, and node names claimed from a second address (name_conflict).",
		}, []string{"reason"}),
		members: &membersCollector{c: c, desc: prometheus.NewDesc(
			"fairshard_cluster_members",
			"Live cluster members as this node sees them, by declared state: active, leaving. Suspect members count as live until declared dead.",
			[]string{"state"}, nil)},
	}
	m.health = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fairshard_cluster_health_score",
		Help: "memberlist's awareness score of this node: 0 is healthy; it grows when this node is slow to answer probes.",
	}, func() float64 {
		if ml := c.ml; ml != nil {
			return float64(ml.GetHealthScore())
		}
		return 0
	})
	m.accepted = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fairshard_cluster_accepted",
		Help: "1 once the cluster has accepted this node as a member (it may own shards); 0 while its peers have not confirmed it, e.g. while they still hold its name at another address.",
	}, func() float64 {
		if c.acceptance.accepted.Load() {
			return 1
		}
		return 0
	})
	for _, r := range []string{"shard_count", "protocol_version", "bad_meta", "name_conflict"} {
		m.refused.WithLabelValues(r)
	}
	return m
}

// register registers every metric on reg; on error it unregisters what it
// registered and returns the error.
func (m *metrics) register(reg prometheus.Registerer) error {
	m.reg = reg
	for _, col := range []prometheus.Collector{
		m.members, m.health, m.accepted, m.ownedShards, m.ownedFraction, m.ownershipChanges, m.shardsMoved,
		m.refused,
	} {
		if err := reg.Register(col); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("register cluster metrics: %w (is another Cluster using this Registerer?)", err)
			}
			return fmt.Errorf("register cluster metrics: %w", err)
		}
		m.registered = append(m.registered, col)
	}
	return nil
}

func (m *metrics) unregister() {
	for _, col := range m.registered {
		m.reg.Unregister(col)
	}
	m.registered = nil
}

// membersCollector reports fairshard_cluster_members from the Cluster's peer
// map at scrape time. Suspect members are not told apart: memberlist does
// not report suspicion to delegates, and reading its nodes outside a
// callback races with its writes.
type membersCollector struct {
	c    *Cluster
	desc *prometheus.Desc
}

func (mc *membersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- mc.desc }

func (mc *membersCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{string(MemberActive): 0, string(MemberLeaving): 0}
	for _, p := range mc.c.livePeers() {
		if m, err := decodeMeta(p.meta); err == nil {
			counts[string(m.State)]++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(mc.desc, prometheus.GaugeValue, float64(n), state)
	}
}
