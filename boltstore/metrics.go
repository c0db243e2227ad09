package boltstore

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/outbox"
)

// metrics are the store's Prometheus instruments. With a nil Registerer they
// still exist (and cost the same) but are exported nowhere.
type metrics struct {
	commitDuration prometheus.Histogram
	batchOps       prometheus.Histogram
	expired        prometheus.Counter
	packed         prometheus.Counter
	commitFailures prometheus.Counter
	reopens        *prometheus.CounterVec
	writable       prometheus.GaugeFunc
}

// statusGauge exports the row count per status from in-memory totals kept
// in step with committed counter deltas (no bbolt read per scrape).
type statusGauge struct {
	desc   *prometheus.Desc
	totals *[nsCountsLen]atomic.Int64
}

var gaugeStatuses = [nsCountsLen]outbox.Status{
	nsPending:   outbox.StatusPending,
	nsClaimed:   outbox.StatusClaimed,
	nsDone:      outbox.StatusDone,
	nsFailed:    outbox.StatusFailed,
	nsCancelled: outbox.StatusCancelled,
}

func (g *statusGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *statusGauge) Collect(ch chan<- prometheus.Metric) {
	for i, st := range gaugeStatuses {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(g.totals[i].Load()), string(st))
	}
}

func newMetrics(reg prometheus.Registerer, totals *[nsCountsLen]atomic.Int64, writable func() bool) (*metrics, error) {
	m := &metrics{
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fairshard_store_commit_duration_seconds",
			Help: "Duration of one group commit (bbolt write transaction incl. fsync), in seconds.",
			// 0.5 ms … ~1 s: an fsync costs 1–2 ms here; the top buckets catch
			// slow disks and huge batches.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		}),
		batchOps: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fairshard_store_batch_ops",
			Help: "Operations (appends, claims, settles, ...) coalesced into one group commit.",
			// 1 … 1024 operations: the queue rarely holds more than the number
			// of concurrent callers.
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_store_tombstones_expired_total",
			Help: "Tombstones (done, cancelled, failed rows) removed by the retention sweep.",
		}),
		packed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_store_tombstones_packed_total",
			Help: "Done and cancelled rows packed into bundles by the pack pass (a few dozen bytes each instead of a row and two index entries).",
		}),
		commitFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_store_commit_failures_total",
			Help: "Commits that failed (a write or fsync error, a full disk); each stops all writes until the data file is reopened.",
		}),
		reopens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_store_reopens_total",
			Help: "Reopens of the data file after a failed commit, by result (ok: writes accepted again; failed: retried later).",
		}, []string{"result"}),
		writable: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fairshard_store_writable",
			Help: "1 while the store accepts writes, 0 after a failed commit until a reopen succeeds (the node is not ready meanwhile).",
		}, func() float64 {
			if writable() {
				return 1
			}
			return 0
		}),
	}
	for _, r := range []string{"ok", "failed"} {
		m.reopens.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	gauge := &statusGauge{
		desc: prometheus.NewDesc("fairshard_store_rows",
			"Rows held in this node's store, by status (all shards, owned or not).",
			[]string{"status"}, nil),
		totals: totals,
	}
	for _, c := range []prometheus.Collector{m.commitDuration, m.batchOps, m.expired, m.packed, m.commitFailures, m.reopens, m.writable, gauge} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
