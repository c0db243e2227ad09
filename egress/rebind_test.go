package egress_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/egress"
)

// dnsServer is a real DNS server on loopback UDP that answers A queries
// from answers: each name's list in turn (TTL 0), one entry per query, so
// a name can alternate between two addresses as a rebinding attacker's
// does. AAAA and unknown names get an empty answer.
type dnsServer struct {
	conn    net.PacketConn
	mu      sync.Mutex
	answers map[string][]netip.Addr
	next    map[string]int
}

func newDNSServer(t *testing.T, answers map[string][]netip.Addr) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: conn, answers: answers, next: map[string]int{}}
	t.Cleanup(func() { _ = conn.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out := s.answer(buf[:n]); out != nil {
			_, _ = s.conn.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query (RFC 1035 §4.1), nil if the query
// cannot be read.
func (s *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	question := q[12 : i+5]
	name := strings.ToLower(strings.Join(labels, "."))

	var ip netip.Addr
	s.mu.Lock()
	if list := s.answers[name]; qtype == 1 && len(list) > 0 {
		ip = list[s.next[name]%len(list)]
		s.next[name]++
	}
	s.mu.Unlock()

	out := make([]byte, 12, 64)
	copy(out, q[:2])                            // id
	binary.BigEndian.PutUint16(out[2:], 0x8180) // response, recursion desired and available, NOERROR
	binary.BigEndian.PutUint16(out[4:], 1)      // one question
	if ip.IsValid() {
		binary.BigEndian.PutUint16(out[6:], 1) // one answer
	}
	out = append(out, question...)
	if ip.IsValid() {
		a := ip.As4()
		out = append(out, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4) // name → the question's, A, IN, TTL 0, 4 bytes
		out = append(out, a[:]...)
	}
	return out
}

// resolver resolves every name through s only.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}

// countingServer is a real HTTP server on addr counting its requests.
type countingServer struct {
	hits atomic.Int64
	srv  *http.Server
}

func listenCounting(t *testing.T, addr string) (*countingServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &countingServer{}
	c.srv = &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { c.hits.Add(1) }), ReadHeaderTimeout: time.Second}
	go func() { _ = c.srv.Serve(ln) }()
	t.Cleanup(func() { _ = c.srv.Close() })
	return c, nil
}

// TestNameInAllowListStillChecksTheAddress: a listed name allows the
// name only; every address it resolves to is still judged, on every
// dial. Input, the reproducer: --target-allow rebind.test with a name
// whose DNS alternates an allowed address and 127.0.0.1 (TTL 0), and
// --target-allow metadata.google.internal resolving to 169.254.169.254. The DNS server and both
// HTTP servers are real; the target (127.0.0.2) and the canary
// (127.0.0.1) listen on one port, so only the address tells them apart.
func TestNameInAllowListStillChecksTheAddress(t *testing.T) {
	var target, canary *countingServer
	var port string
	// Bind the canary first on a free port, then the target on the same
	// port of 127.0.0.2.
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ = net.SplitHostPort(ln.Addr().String())
		_ = ln.Close()
		if canary, err = listenCounting(t, "127.0.0.1:"+port); err != nil {
			continue
		}
		if target, err = listenCounting(t, "127.0.0.2:"+port); err == nil {
			break
		}
		_ = canary.srv.Close()
		canary = nil
	}
	if target == nil || canary == nil {
		t.Skip("cannot bind 127.0.0.1 and 127.0.0.2 on one port")
	}
	dns := newDNSServer(t, map[string][]netip.Addr{
		"rebind.test":              {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")},
		"metadata.google.internal": {netip.MustParseAddr("169.254.169.254")},
	})
	clientFor := func(p *egress.Policy) *http.Client {
		return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true, // every request dials, so every request resolves again
			DialContext:       p.DialContext(&net.Dialer{Timeout: 2 * time.Second, Resolver: dns.resolver()}),
		}}
	}
	deliver := func(p *egress.Policy, url string, n int) (ok int, refused []error) {
		c := clientFor(p)
		for range n {
			resp, err := c.Get(url)
			if err != nil {
				refused = append(refused, err)
				continue
			}
			resp.Body.Close()
			ok++
		}
		return ok, refused
	}
	url := "http://rebind.test:" + port + "/deliver"

	// The reproducer's flag: the name alone. Neither loopback address is
	// public, so neither is reached through the name.
	nameOnly, err := egress.Parse([]string{"rebind.test"})
	if err != nil {
		t.Fatal(err)
	}
	ok, refused := deliver(nameOnly, url, 10)
	if ok != 0 || canary.hits.Load() != 0 || target.hits.Load() != 0 {
		t.Fatalf("--target-allow rebind.test: %d delivered, canary hit %d times, target %d; want none (loopback is not public)", ok, canary.hits.Load(), target.hits.Load())
	}
	for _, err := range refused {
		if !errors.Is(err, egress.ErrRefused) || !strings.Contains(err.Error(), "rebind.test") {
			t.Errorf("refused with %v, want the egress policy naming the host", err)
		}
	}

	// The allowed address listed too: deliveries reach it when the name
	// resolves there, never the canary when it resolves to 127.0.0.1.
	withCIDR, err := egress.Parse([]string{"rebind.test", "127.0.0.2/32"})
	if err != nil {
		t.Fatal(err)
	}
	ok, refused = deliver(withCIDR, url, 10)
	if canary.hits.Load() != 0 {
		t.Errorf("the loopback canary got %d deliveries through rebind.test", canary.hits.Load())
	}
	if ok == 0 || int64(ok) != target.hits.Load() || len(refused) == 0 {
		t.Errorf("--target-allow rebind.test,127.0.0.2/32: %d delivered (target saw %d), %d refused; want both, alternating", ok, target.hits.Load(), len(refused))
	}
	for _, err := range refused {
		if !errors.Is(err, egress.ErrRefused) || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("refused with %v, want the egress policy naming 127.0.0.1", err)
		}
	}

	// The metadata name: refused before any connection (no connect
	// timeout: the check runs before connect(2)).
	meta, _ := egress.Parse([]string{"metadata.google.internal", "10.0.0.0/8"})
	start := time.Now()
	_, err = clientFor(meta).Get("http://metadata.google.internal/computeMetadata/v1/")
	if !errors.Is(err, egress.ErrRefused) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Errorf("--target-allow metadata.google.internal: %v, want refused naming 169.254.169.254", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refusal took %v: it must come before the connect", d)
	}
	// A public address stays reachable through a listed name; an
	// unlisted name's address must be in the list.
	if err := nameOnly.AllowedFor("rebind.test", netip.MustParseAddr("8.8.8.8")); err != nil {
		t.Errorf("a listed name resolving to a public address: %v", err)
	}
	if err := nameOnly.AllowedFor("other.test", netip.MustParseAddr("8.8.8.8")); !errors.Is(err, egress.ErrRefused) {
		t.Errorf("an unlisted name: %v, want refused", err)
	}
}

// TestTranslatedForms: an IPv6 address that carries an IPv4 one is judged
// by the IPv4 it carries: refused by the real dial path before
// connecting, and by an allow list without it. Input, the reproducer:
// the metadata address in NAT64 ([64:ff9b::a9fe:a9fe]), 6to4
// ([2002:a9fe:a9fe::1]) and IPv4-compatible ([::a9fe:a9fe]) form, with
// the default policy; and the other layouts that carry an IPv4.
func TestTranslatedForms(t *testing.T) {
	def, _ := egress.Parse(nil)
	metadata := []string{
		"64:ff9b::a9fe:a9fe",         // NAT64, well-known prefix
		"2002:a9fe:a9fe::1",          // 6to4
		"::a9fe:a9fe",                // IPv4-compatible
		"::ffff:169.254.169.254",     // IPv4-mapped
		"::ffff:0:a9fe:a9fe",         // IPv4-translated
		"64:ff9b:1:a9fe:a9:fe00::",   // NAT64 local use, /48 layout
		"64:ff9b:1:0:a9:fea9:fe00:0", // NAT64 local use, /64 layout
		"64:ff9b:1::a9fe:a9fe",       // NAT64 local use, /96 layout
		"2001:0:a9fe:a9fe::1",        // Teredo, server field
	}
	for _, s := range metadata {
		ip := netip.MustParseAddr(s)
		// (A local-use layout may be refused for another of its
		// candidates, all in 169.254.0.0/16.)
		if err := def.Allowed(ip); !errors.Is(err, egress.ErrRefused) || !strings.Contains(err.Error(), "169.254.") {
			t.Errorf("default policy, %s: %v; want refused as the link-local IPv4 it carries", s, err)
		}
		start := time.Now()
		_, err := client(def).Get("http://[" + s + "]/latest/meta-data/")
		if !errors.Is(err, egress.ErrRefused) {
			t.Errorf("GET http://[%s]/: %v, want refused by the egress policy", s, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("GET http://[%s]/ took %v: the check must precede the connect", s, d)
		}
	}
	// Loopback in translated form is loopback: an allow list without it
	// refuses it, one with it allows it (as the IPv4).
	narrow, _ := egress.Parse([]string{"10.0.0.0/8"})
	lo, _ := egress.Parse([]string{"127.0.0.0/8"})
	for _, s := range []string{"64:ff9b::7f00:1", "2002:7f00:1::", "::7f00:1", "::ffff:127.0.0.1"} {
		ip := netip.MustParseAddr(s)
		if err := narrow.Allowed(ip); !errors.Is(err, egress.ErrRefused) {
			t.Errorf("--target-allow 10.0.0.0/8, %s: %v; want refused (it carries 127.0.0.1)", s, err)
		}
		if err := lo.Allowed(ip); err != nil {
			t.Errorf("--target-allow 127.0.0.0/8, %s: %v; want allowed (it carries 127.0.0.1)", s, err)
		}
	}
	// Plain IPv6 is not decoded: ::1 is loopback, a global address is itself.
	for _, s := range []string{"::1", "2001:4860:4860::8888", "fd12::1"} {
		if got := egress.Carried(netip.MustParseAddr(s)); len(got) != 1 || got[0] != netip.MustParseAddr(s) {
			t.Errorf("Carried(%s) = %v, want itself", s, got)
		}
		if err := def.Allowed(netip.MustParseAddr(s)); err != nil {
			t.Errorf("default policy refuses %s: %v", s, err)
		}
	}
}
