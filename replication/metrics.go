package replication

import "github.com/prometheus/client_golang/prometheus"

// metrics are a Replicator's (STYLE §8: one struct per component,
// registered on an injected Registerer; none when it is nil).
type metrics struct {
	factor, copies, writeCopies prometheus.Gauge
	underShards, underRows      prometheus.Gauge
	syncingShards               prometheus.Gauge
	lag                         prometheus.Histogram
	lagOldest                   prometheus.Gauge
	pending                     prometheus.Gauge
	shipped                     prometheus.Counter
	shipFailures                prometheus.Counter
	shipDropped                 prometheus.Counter
	syncRows, syncBytes         *prometheus.CounterVec
	syncedShards                prometheus.Counter
	mismatches                  prometheus.Counter
	repairedShards              prometheus.Counter
	repairedRows                *prometheus.CounterVec
	writes                      *prometheus.CounterVec
	forwardFailures             prometheus.Counter
	dropped                     prometheus.Counter
	received                    prometheus.Counter
	handoverShards              prometheus.Gauge
	handoverWait                prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		factor:        g("fairshard_replication_factor", "The cluster's replication factor R (copies wanted of every shard)."),
		copies:        g("fairshard_replication_copies", "Copies every shard gets in the current view: min(R, active members)."),
		writeCopies:   g("fairshard_replication_write_copies", "The write-copies minimum this node applies: an append is answered only once every row is durable on this many replicas."),
		underShards:   g("fairshard_replication_under_replicated_shards", "Shards this node is primary of that have fewer than R synced copies (fewer members than R, or a replica still syncing). Summed over the nodes: the cluster's count."),
		underRows:     g("fairshard_replication_under_replicated_rows", "Rows (held here) of the shards counted by fairshard_replication_under_replicated_shards."),
		syncingShards: g("fairshard_replication_syncing_shards", "Shards this node is a replica of and has not finished syncing (a primary does not claim from a shard before it is synced)."),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fairshard_replication_lag_seconds",
			Help:    "Time from a state change of a row (settle, retry, cancel, redrive, re-arm) on this node to its acknowledgement by a backup.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		lagOldest:    g("fairshard_replication_lag_oldest_seconds", "Age of the oldest state change not yet acknowledged by every backup (0 when none waits)."),
		pending:      g("fairshard_replication_pending_changes", "State changes queued for backups (rows × backups)."),
		shipped:      c("fairshard_replication_shipped_rows_total", "Row state changes shipped to backups and acknowledged durable there."),
		shipFailures: c("fairshard_replication_ship_failures_total", "Batches of state changes a backup did not acknowledge (retried)."),
		shipDropped:  c("fairshard_replication_ship_dropped_total", "State changes dropped from a backup's queue when it grew past its bound (200,000 changes by default; that backup's shards are repaired by digest instead)."),
		syncRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_replication_sync_rows_total",
			Help: "Rows received by shard sync and repair, by kind: bulk (a shard copied whole) or diff (rows exchanged after a key/version comparison).",
		}, []string{"kind"}),
		syncBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_replication_sync_bytes_total",
			Help: "Bytes of rows (fields and payloads) received by shard sync and repair, by kind.",
		}, []string{"kind"}),
		syncedShards:   c("fairshard_replication_shards_synced_total", "Shard syncs completed here (this node became a synced replica)."),
		mismatches:     c("fairshard_replication_digest_mismatches_total", "Digest comparisons with a replica that disagreed twice in a row (each starts a repair)."),
		repairedShards: c("fairshard_replication_repaired_shards_total", "Shard repairs that exchanged rows (digest mismatches repaired)."),
		repairedRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_replication_repaired_rows_total",
			Help: "Rows a repair exchanged, by direction: pulled (merged here) or pushed (merged on the replica).",
		}, []string{"direction"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_replication_writes_total",
			Help: "Append batches this node coordinated, by outcome: ok, insufficient_copies (answered 503) or error.",
		}, []string{"outcome"}),
		forwardFailures: c("fairshard_replication_forward_failures_total", "Forwards of appended rows to a replica that failed (the next replica of the set is tried)."),
		dropped:         c("fairshard_replication_dropped_rows_total", "Rows deleted here because every member of their shard's replica set confirmed holding them (rebalance, drain)."),
		handoverShards:  g("fairshard_replication_handover_shards", "Shards this node became primary of and does not claim from yet: another live member still delivers rows of them or ships their settles (bounded by the handover timeout)."),
		handoverWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fairshard_replication_handover_wait_seconds",
			Help:    "Time a new primary waited, before claiming from a shard, for the other members' deliveries of it to finish.",
			Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		received: c("fairshard_replication_received_rows_total", "Rows other nodes pushed here and this node merged: state changes shipped by a primary, repairs, copies handed over by a node leaving the set or draining."),
	}
	for _, k := range []string{"bulk", "diff"} {
		m.syncRows.WithLabelValues(k)
		m.syncBytes.WithLabelValues(k)
	}
	for _, d := range []string{"pulled", "pushed"} {
		m.repairedRows.WithLabelValues(d)
	}
	for _, o := range []string{"ok", "insufficient_copies", "error"} {
		m.writes.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.factor, m.copies, m.writeCopies, m.underShards, m.underRows,
		m.syncingShards, m.lag, m.lagOldest, m.pending, m.shipped, m.shipFailures, m.shipDropped, m.syncRows,
		m.syncBytes, m.syncedShards, m.mismatches, m.repairedShards, m.repairedRows, m.writes, m.forwardFailures, m.dropped, m.received, m.handoverShards, m.handoverWait} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
