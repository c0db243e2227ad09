package testmetrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/internal/testmetrics"
)

// Sum adds the matching series of counters, gauges and histograms (their
// counts), filters by every label given, and reads an absent metric as 0.
func TestSumMatchesEveryLabelGiven(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rows_total", Help: "h"}, []string{"kind", "node"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "depth", Help: "h"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "wait_seconds", Help: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("bulk", "a").Add(3)
	c.WithLabelValues("bulk", "b").Add(4)
	c.WithLabelValues("page", "a").Add(5)
	g.Set(7)
	h.Observe(1)
	h.Observe(2)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rows_total", nil, 12},
		{"rows_total", []string{"kind=bulk"}, 7},
		{"rows_total", []string{"kind=bulk", "node=a"}, 3},
		{"rows_total", []string{"kind=none"}, 0},
		{"depth", nil, 7},
		{"wait_seconds", nil, 2},
		{"absent_total", nil, 0},
	} {
		if got := testmetrics.Sum(t, reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
