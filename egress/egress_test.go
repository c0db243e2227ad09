package egress_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/egress"
)

// client delivers through p as the dispatcher does (dial-time check).
func client(p *egress.Policy) *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext: p.DialContext(&net.Dialer{Timeout: 2 * time.Second}),
	}}
}

// TestDialTime: a real loopback target is reached by the default policy
// and refused by an allow list without loopback, whether the URL names
// it as 127.0.0.1, as "localhost" (resolved at dial time) or in a numeric
// form; the refusal happens before connecting (no request arrives).
func TestDialTime(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits++ }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))

	def, _ := egress.Parse(nil)
	if resp, err := client(def).Get(srv.URL); err != nil {
		t.Fatalf("default policy refused loopback: %v", err)
	} else {
		resp.Body.Close()
	}
	narrow, err := egress.Parse([]string{"10.0.0.0/8", "hooks.example"})
	if err != nil {
		t.Fatal(err)
	}
	urls := []string{srv.URL, "http://localhost:" + port, "http://2130706433:" + port, "http://0x7f000001:" + port, "http://[::ffff:127.0.0.1]:" + port}
	for _, u := range urls {
		resp, err := client(narrow).Get(u)
		if err == nil {
			resp.Body.Close()
			t.Errorf("GET %s with --target-allow 10.0.0.0/8: answered %d, want refused", u, resp.StatusCode)
			continue
		}
		// Names the resolver cannot map (numeric forms without cgo) fail
		// at resolution; every form that resolves must be refused by us.
		var dnsErr *net.DNSError
		if !errors.Is(err, egress.ErrRefused) && !errors.As(err, &dnsErr) {
			t.Errorf("GET %s: %v, want the egress refusal", u, err)
		}
	}
	if hits != 1 {
		t.Errorf("target got %d requests, want 1 (the default policy's)", hits)
	}
	// Allowing loopback explicitly reaches it again.
	lo, _ := egress.Parse([]string{"127.0.0.0/8", "::1"})
	if resp, err := client(lo).Get("http://localhost:" + port); err != nil {
		t.Errorf("--target-allow 127.0.0.0/8: %v", err)
	} else {
		resp.Body.Close()
	}
}

// TestDefaultDeny: metadata and link-local addresses are refused by the
// default policy at dial time (no connection attempt: the error comes at
// once, not after a connect timeout); private ranges are allowed.
func TestDefaultDeny(t *testing.T) {
	def, _ := egress.Parse(nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://[fe80::1%25lo]:80/", "http://0.0.0.0:1/", "http://100.100.100.200/"} {
		start := time.Now()
		_, err := client(def).Get(u)
		if !errors.Is(err, egress.ErrRefused) {
			t.Errorf("GET %s: %v, want refused by the egress policy", u, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("GET %s took %v: the check must precede the connect", u, d)
		}
	}
	for _, ip := range []string{"10.1.2.3", "192.168.1.1", "172.16.0.1", "127.0.0.1", "8.8.8.8", "fd12::1"} {
		if err := def.Allowed(netip.MustParseAddr(ip)); err != nil {
			t.Errorf("default policy refuses %s: %v", ip, err)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "a b", "http://x"} {
		if _, err := egress.Parse([]string{bad}); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
