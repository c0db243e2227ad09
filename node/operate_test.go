package node_test

import (
	"net"
	"net/http"
	"runtime"
	"slices"
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

// TestPprofExposure: profiles are behind the token and on loopback unless
// exposed on purpose, and then listed. Input, the reproducer:
// --pprof-addr 0.0.0.0:P with no token and no secrets, which refuses to
// start; so does a loopback one without a token, and one beyond loopback
// without --pprof-insecure. With both it starts, wants the token, and
// /v1/cluster lists the listener under security.exposed.
func TestPprofExposure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		edit  func(*node.Config)
		field string
	}{
		{"no token", func(c *node.Config) { c.PprofAddr = "0.0.0.0:0" }, "--pprof-addr"},
		{"no token, loopback", func(c *node.Config) { c.PprofAddr = "127.0.0.1:0" }, "--api-token"},
		{"beyond loopback", func(c *node.Config) { c.PprofAddr, c.APIToken = "0.0.0.0:0", "tok" }, "--pprof-insecure"},
	} {
		cfg := testConfig(t)
		c.edit(&cfg)
		if _, err := node.New(cfg, nil); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: New = %v, want a refusal naming %s", c.name, err, c.field)
		}
	}
	const token = "pprof-exposed-token"
	n := startNode(t, func(c *node.Config) { c.PprofAddr, c.PprofInsecure, c.APIToken = "0.0.0.0:0", true, token })
	var cl struct {
		Security struct {
			Exposed []string `json:"exposed"`
		} `json:"security"`
	}
	n.mustDo(http.MethodGet, "/v1/cluster", nil, http.StatusOK, &cl)
	if !slices.Contains(cl.Security.Exposed, "--pprof-addr 0.0.0.0:0") {
		t.Errorf("/v1/cluster security.exposed = %v, want the profiling listener", cl.Security.Exposed)
	}
	_, port, _ := net.SplitHostPort(n.PprofAddr())
	for _, p := range []string{"/debug/pprof/cmdline", "/debug/pprof/heap"} {
		if st, b, _ := request(t, http.MethodGet, "http://127.0.0.1:"+port+p, nil, ""); st != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d %.100s, want 401", p, st, b)
		}
	}
}

// TestScrubArgs: every spelling of a secret flag has its value redacted;
// the other arguments are kept as they are.
func TestScrubArgs(t *testing.T) {
	in := []string{"fairshard", "serve", "--api-token", "t1", "-cluster-secret=s1", "--gossip-key=k1,k2", "-gossip-key", "k3",
		"--api-token-file", "/run/token", "--node-name", "n1", "--api-token"}
	want := []string{"fairshard", "serve", "--api-token", node.Redacted, "-cluster-secret=" + node.Redacted, "--gossip-key=" + node.Redacted,
		"-gossip-key", node.Redacted, "--api-token-file", "/run/token", "--node-name", "n1", "--api-token"}
	if got := node.ScrubArgs(in); !slices.Equal(got, want) {
		t.Errorf("ScrubArgs =\n%q\nwant\n%q", got, want)
	}
	if in[3] != "t1" {
		t.Error("ScrubArgs changed its input")
	}
	if got := node.SecretArgs(in[1:]); !slices.Equal(got, []string{"api-token", "cluster-secret", "gossip-key"}) {
		t.Errorf("SecretArgs = %v", got)
	}
}
