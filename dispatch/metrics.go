package dispatch

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the dispatcher's Prometheus series. Labels are namespace
// only: never dispatch_key, workflow_id or shard (PITFALLS, client_golang).
// Namespaces are tenants from the cluster config, so the label set is
// bounded by the number of configured tenants.
type metrics struct {
	claimed   *prometheus.CounterVec // fairshard_rows_claimed_total{namespace}
	delivered *prometheus.CounterVec // fairshard_rows_delivered_total{namespace}
	retried   *prometheus.CounterVec // fairshard_rows_retried_total{namespace}
	failed    *prometheus.CounterVec // fairshard_rows_failed_total{namespace}
	rearmed   prometheus.Counter     // fairshard_rows_rearmed_total
	// fairshard_delivery_outcome_unknown_total{namespace}
	outcomeUnknown *prometheus.CounterVec
	fenced         *prometheus.CounterVec // fairshard_deliveries_fenced_total{namespace}

	claimedNow   *prometheus.GaugeVec   // fairshard_claimed_rows{namespace}
	ceiling      *prometheus.GaugeVec   // fairshard_namespace_ceiling{namespace}
	headroom     *prometheus.GaugeVec   // fairshard_namespace_headroom{namespace}
	atCeiling    *prometheus.CounterVec // fairshard_sweeps_at_ceiling_total{namespace}
	deliveryDur  *prometheus.HistogramVec
	enqueueToDel *prometheus.HistogramVec

	sweepDur       prometheus.Histogram
	sweepErrors    prometheus.Counter
	settleErrors   prometheus.Counter
	inFlight       prometheus.Gauge
	routesNoTarget prometheus.Gauge
}

// collectors lists every series of m, for registration.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.claimed, m.delivered, m.retried, m.failed, m.rearmed, m.outcomeUnknown, m.fenced,
		m.claimedNow, m.ceiling, m.headroom, m.atCeiling, m.deliveryDur, m.enqueueToDel,
		m.sweepDur, m.sweepErrors, m.settleErrors, m.inFlight, m.routesNoTarget,
	}
}

// unregister removes m's series from reg (New failed after registering).
func (m *metrics) unregister(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// newMetrics creates the dispatcher's series and, when reg is not nil,
// registers them all or none.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	m.initRowCounters()
	m.initCeilingSeries()
	m.initLatencyHistograms()
	m.initSweepSeries()
	if reg == nil {
		return m, nil
	}
	if err := m.register(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// initRowCounters creates the counters of what happened to rows: claimed,
// delivered, retried, failed, re-armed, fenced and unknown outcomes. Every
// vector is labelled by namespace only.
func (m *metrics) initRowCounters() {
	ns := []string{"namespace"}
	m.claimed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_rows_claimed_total",
		Help: "Rows this node claimed for delivery, by namespace.",
	}, ns)
	m.delivered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_rows_delivered_total",
		Help: "Rows delivered (target answered 2xx) and settled done, by namespace.",
	}, ns)
	m.retried = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_rows_retried_total",
		Help: "Delivery attempts that failed retryably and were put back to pending with backoff, by namespace.",
	}, ns)
	m.failed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_rows_failed_total",
		Help: "Rows failed for good (dead letters: permanent error or attempts exhausted), by namespace.",
	}, ns)
	m.rearmed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fairshard_rows_rearmed_total",
		Help: "Stale claims re-armed to pending (visibility timeout passed, or left over from before a restart).",
	})
	m.fenced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_deliveries_fenced_total",
		Help: "Claimed rows not sent because this process was paused after their claim (its shards may have another primary now): back to pending, attempt unchanged.",
	}, ns)
	m.outcomeUnknown = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_delivery_outcome_unknown_total",
		Help: "Delivery attempts whose outcome is unknown (the request went out in full, then timed out or lost its connection): the target may have the row; it is retried with backoff.",
	}, ns)
}

// initCeilingSeries creates the per-namespace backpressure series: claimed
// rows, the per-node ceiling, headroom (ceiling minus CLAIMED, never
// pending) and sweeps that ended at the ceiling.
func (m *metrics) initCeilingSeries() {
	ns := []string{"namespace"}
	m.claimedNow = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fairshard_claimed_rows",
		Help: "Rows of the namespace claimed on this node, as of the last sweep (CLAIMED only, never pending).",
	}, ns)
	m.ceiling = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fairshard_namespace_ceiling",
		Help: "This node's per-node ceiling of the namespace: ceil(quota × owned/total) rows.",
	}, ns)
	m.headroom = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fairshard_namespace_headroom",
		Help: "Per-node ceiling minus claimed rows of the namespace after the last sweep (rows, ≥ 0).",
	}, ns)
	m.atCeiling = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fairshard_sweeps_at_ceiling_total",
		Help: "Sweeps that ended with the namespace at its per-node ceiling (no headroom left).",
	}, ns)
}

// initLatencyHistograms creates the per-namespace delivery latency
// histograms; their largest buckets lie above the longest wait they measure
// so slow rows land in a real bucket.
func (m *metrics) initLatencyHistograms() {
	ns := []string{"namespace"}
	// 1 ms to 30 s: the largest bucket is above the default 10 s
	// delivery timeout, so timed-out attempts land in a real bucket.
	m.deliveryDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fairshard_delivery_duration_seconds",
		Help:    "Duration of one HTTP delivery attempt (seconds), whatever its outcome.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, ns)
	// 5 ms to 6 h: a row that exhausts the default retry policy spends
	// about half an hour in backoff; 6 h covers long target outages.
	m.enqueueToDel = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fairshard_enqueue_to_delivery_seconds",
		Help:    "Time from a row's created_at to its settle as done (seconds), retries included.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600},
	}, ns)
}

// initSweepSeries creates the process-wide series of the sweep loop and the
// deliveries it started: sweep duration, store errors, rows in flight and
// routes without a target.
func (m *metrics) initSweepSeries() {
	// 100 µs to 5 s: a healthy sweep is a few ms; seconds mean the
	// store is struggling.
	m.sweepDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fairshard_sweep_duration_seconds",
		Help:    "Duration of one claim sweep (seconds), store reads and claims included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
	})
	m.sweepErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fairshard_sweep_errors_total",
		Help: "Sweeps and re-arm passes that failed on a store error (retried on the next tick).",
	})
	m.settleErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fairshard_settle_errors_total",
		Help: "Settle calls (complete, retry, fail) the store rejected; the row stays claimed until re-armed. Hopefully 0.",
	})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fairshard_deliveries_in_flight",
		Help: "Rows this process is delivering right now.",
	})
	m.routesNoTarget = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fairshard_routes_without_target",
		Help: "Routes with visible pending rows but no delivery target configured, as of the last sweep; their rows wait.",
	})
}

// register registers every series of m with reg, all or nothing: when any
// registration fails, the ones that succeeded are unregistered so the
// registry is left as it was.
func (m *metrics) register(reg prometheus.Registerer) error {
	var (
		errs []error
		done []prometheus.Collector
	)
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, c)
	}
	if err := errors.Join(errs...); err != nil {
		for _, c := range done { // leave the registry as it was
			reg.Unregister(c)
		}
		return fmt.Errorf("dispatch: register metrics: %w", err)
	}
	return nil
}
