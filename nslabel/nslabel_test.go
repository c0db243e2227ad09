package nslabel_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/nslabel"
)

// TestFloodBounded: 10,000 namespaces through a counter labelled by
// Label make at most N+1 series (10,000 namespaces must not mean 30,000
// series); the first N keep their own.
func TestFloodBounded(t *testing.T) {
	l := nslabel.New(100)
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"namespace"})
	for i := range 10_000 {
		c.WithLabelValues(l.Label(fmt.Sprintf("ns-%05d", i))).Inc()
	}
	if n := testutil.CollectAndCount(c); n != 101 {
		t.Errorf("%d series for 10,000 namespaces, want 101", n)
	}
	if got := l.Label("ns-00042"); got != "ns-00042" {
		t.Errorf("an early namespace lost its label: %q", got)
	}
	if got := l.Label("ns-09999"); got != nslabel.Other {
		t.Errorf("a late namespace got its own label: %q", got)
	}
	if got := testutil.ToFloat64(c.WithLabelValues(nslabel.Other)); got != 9900 {
		t.Errorf("_other counted %v, want 9900", got)
	}
	if !strings.HasPrefix(nslabel.Other, "_") {
		t.Error("Other must not look like a namespace")
	}
	var nilL *nslabel.Limiter
	if nilL.Label("a") != "a" {
		t.Error("nil Limiter must return the namespace")
	}
}
