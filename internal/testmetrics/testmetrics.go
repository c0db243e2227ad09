// Package testmetrics reads Prometheus metrics by name in tests: the sum
// of the samples a registry holds, as a test asserts them by count
// (client_golang's testutil reads a collector, not a name).
package testmetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sum returns the sum of the samples of the metric called name in g whose
// labels include every one of labels, each "label=value" (none: every
// sample): a counter's or gauge's value, a histogram's observation count.
// A metric g does not hold (a vector with no series yet) sums to 0. It
// fails t when g cannot be gathered or a label is not "label=value".
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	want := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("testmetrics: label %q is not label=value", l)
		}
		want[k] = v
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("testmetrics: gather %s: %v", name, err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
					matched++
				}
			}
			if matched != len(want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
