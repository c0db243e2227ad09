package httpapi

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's own metrics.
type metrics struct {
	appendRows     *prometheus.CounterVec // by outcome
	appendRequests *prometheus.CounterVec // by code
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		appendRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_append_rows_total", Help: "Rows answered by POST /v1/rows on this node, by outcome (created, duplicate).",
		}, []string{"outcome"}),
		appendRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_append_requests_total", Help: "POST /v1/rows requests by HTTP status code.",
		}, []string{"code"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.appendRows, m.appendRequests} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("httpapi: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
