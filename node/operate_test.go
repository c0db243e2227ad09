package node_test

import (
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/node"
)

// TestPprofAndBuildInfo: --pprof-addr serves net/http/pprof on its own
// listener behind the API token, not on the API's; fairshard_build_info
// is 1 with the binary's Go version and the release version given.
func TestPprofAndBuildInfo(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) {
		host, _, _ := net.SplitHostPort(c.HTTPAddr)
		c.PprofAddr = net.JoinHostPort(host, "0")
		c.APIToken = "pprof-token"
		c.Version = "9.9.9"
	})
	addr := n.PprofAddr()
	if addr == "" || addr == n.ListenAddr() {
		t.Fatalf("pprof address %q (API on %s): want its own listener", addr, n.ListenAddr())
	}
	st, body, _ := request(t, http.MethodGet, "http://"+addr+"/debug/pprof/", nil, "")
	if st != http.StatusUnauthorized {
		t.Fatalf("pprof without the token: %d %s", st, body)
	}
	st, body, _ = request(t, http.MethodGet, "http://"+addr+"/debug/pprof/", nil, "pprof-token")
	if st != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("pprof index with the token: %d %.200s", st, body)
	}
	st, body, _ = request(t, http.MethodGet, "http://"+addr+"/debug/pprof/goroutine?debug=1", nil, "pprof-token")
	if st != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("goroutine profile: %d %.200s", st, body)
	}
	if st, _ := n.do(http.MethodGet, "/debug/pprof/", nil); st != http.StatusNotFound {
		t.Fatalf("pprof on the API listener: %d, want 404", st)
	}

	mfs, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "fairshard_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || labels["version"] != "9.9.9" || labels["go_version"] != runtime.Version() {
			t.Fatalf("fairshard_build_info = %v %v", m.GetGauge().GetValue(), labels)
		}
		found = true
	}
	if !found {
		t.Fatal("no fairshard_build_info metric")
	}
	// Off by default.
	if d := startNode(t, nil); d.PprofAddr() != "" {
		t.Fatalf("pprof listening by default on %s", d.PprofAddr())
	}
}
