package transfer

import "github.com/prometheus/client_golang/prometheus"

// metrics are a Mover's counters (STYLE §8: one struct per component,
// registered on an injected Registerer; none when it is nil).
type metrics struct {
	rows            prometheus.Counter
	bytes           prometheus.Counter
	batches         *prometheus.CounterVec
	releaseFailures prometheus.Counter
	stranded        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_transfer_rows_total",
			Help: "Rows moved to another node and acknowledged durable there (handoff and drain).",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_transfer_bytes_total",
			Help: "Bytes of rows moved to another node (row fields and payloads, before the wire encoding).",
		}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_transfer_batches_total",
			Help: "Transfer batches sent, by outcome: ok (acknowledged) or failed (unmarked for a later retry).",
		}, []string{"outcome"}),
		releaseFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_transfer_release_failures_total",
			Help: "CompleteTransfer or AbortTransfer calls that failed (each is retried; see fairshard_transfer_stranded_rows).",
		}),
		stranded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_transfer_stranded_rows",
			Help: "Rows left marked in-transfer (not claimable) because their release failed; retried before any new batch. Hopefully 0.",
		}),
	}
	m.batches.WithLabelValues("ok")
	m.batches.WithLabelValues("failed")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.rows, m.bytes, m.batches, m.releaseFailures, m.stranded} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
