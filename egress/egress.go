// Package egress is the delivery targets' egress policy (--target-allow):
// which addresses a delivery may connect to, checked at dial time against
// the address actually dialled (after DNS, so a name that resolves or
// re-resolves to a forbidden address, and numeric forms such as
// 0x7f000001 or 2130706433, are judged by the IP they reach).
//
// An IPv6 address that carries an IPv4 address is judged by the IPv4 it
// carries: IPv4-mapped (::ffff:a.b.c.d), IPv4-translated
// (::ffff:0:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96,
// and 64:ff9b:1::/48 in each of its RFC 6052 layouts), 6to4 (2002::/16)
// and Teredo (2001::/32, server and client). A translator or relay on the
// way would deliver to that IPv4, so [64:ff9b::a9fe:a9fe] is the metadata
// endpoint 169.254.169.254 as far as the policy is concerned. When the
// layout is ambiguous (64:ff9b:1::/48) every candidate must pass.
//
// Without an allow list (the default) every address is allowed except
// DefaultDeny: link-local (169.254.0.0/16, fe80::/10, which hold the cloud
// metadata endpoints 169.254.169.254 and 169.254.170.2), the other known
// metadata addresses (fd00:ec2::254, 100.100.100.200), unspecified,
// multicast and broadcast addresses. Loopback and private ranges are
// allowed: targets are usually internal services, and a single-host
// set-up delivers to 127.0.0.1.
//
// With an allow list, an address in one of its CIDRs (or IPs) is allowed;
// so is a public address reached through one of its host names. A host
// name allows the name, not whatever it resolves to: the name's owner (or
// whoever answers its DNS, with a TTL of 0 between two lookups) must not
// be able to point deliveries at loopback, a private network or a
// metadata endpoint. So an address dialled for a listed name is refused
// when it is in DefaultDeny or not public (loopback, private, CGNAT,
// unique-local, documentation and reserved ranges), unless a CIDR of the
// list holds it; every other address outside the CIDRs is refused.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// ErrRefused is wrapped by the dial error of a refused address.
var ErrRefused = errors.New("egress policy refuses the address")

// DefaultDeny are the prefixes refused without an allow list, and refused
// to listed host names whatever the list holds.
var DefaultDeny = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, AWS/GCP/Azure metadata, ECS task metadata
	netip.MustParsePrefix("fe80::/10"),      // IPv6 link-local
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network", 0.0.0.0 dials loopback
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("224.0.0.0/4"), // multicast
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("255.255.255.255/32"),
}

// NotPublic are the ranges, beside DefaultDeny, that a listed host name
// may not reach unless a CIDR of the list holds the address: loopback,
// private and shared networks, unique-local, and ranges that are never a
// public host.
var NotPublic = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT, shared
	netip.MustParsePrefix("192.0.0.0/24"),  // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),  // documentation
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"), // reserved
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::/96"),    // IPv4-compatible forms not decoded (0.x.y.z)
	netip.MustParsePrefix("fc00::/7"), // unique-local
	netip.MustParsePrefix("100::/64"), // discard-only
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("fec0::/10"), // deprecated site-local
}

// Policy decides which addresses deliveries may connect to. The zero
// value and nil are the default policy. Safe for concurrent use.
type Policy struct {
	allow []netip.Prefix
	hosts map[string]bool // lower-case host names trusted by name
}

// Parse builds a Policy from --target-allow entries: CIDRs ("10.0.0.0/8"),
// single IPs ("10.1.2.3", "::1") or host names ("hooks.internal"). No
// entry: the default policy. An error names the bad entry.
func Parse(entries []string) (*Policy, error) {
	p := &Policy{hosts: map[string]bool{}}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case strings.Contains(e, "/"):
			pr, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR: %v", e, err)
			}
			if pr.Addr().Is4In6() {
				pr = netip.PrefixFrom(pr.Addr().Unmap(), max(pr.Bits()-96, 0))
			}
			p.allow = append(p.allow, pr.Masked())
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				p.allow = append(p.allow, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			if !validHostName(e) {
				return nil, fmt.Errorf("%q is not a CIDR, an IP or a host name", e)
			}
			p.hosts[normalHost(e)] = true
		}
	}
	return p, nil
}

func normalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

func validHostName(s string) bool {
	if len(s) > 253 || s == "" {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Default reports whether p is the default policy (no allow list).
func (p *Policy) Default() bool { return p == nil || (len(p.allow) == 0 && len(p.hosts) == 0) }

// Listed reports whether host (a URL's host, without port) is a host name
// of p's allow list.
func (p *Policy) Listed(host string) bool {
	return p != nil && len(p.hosts) > 0 && p.hosts[normalHost(host)]
}

// Allowed reports whether ip may be dialled for a target named by an IP
// or by a host name the allow list does not list; nil if so, else an
// error wrapping ErrRefused that names the address and why.
func (p *Policy) Allowed(ip netip.Addr) error { return p.AllowedFor("", ip) }

// AllowedFor reports whether ip may be dialled for a target whose URL
// names host (without port): a listed host name is judged by the rules
// for names (see the package doc), anything else as Allowed. nil if so,
// else an error wrapping ErrRefused that names the address and why.
func (p *Policy) AllowedFor(host string, ip netip.Addr) error {
	ip = ip.Unmap().WithZone("") // a zoned address is never Contained
	byName := host != "" && p.Listed(host)
	for _, a := range Carried(ip) {
		if err := p.allowedOne(host, byName, ip, a); err != nil {
			return err
		}
	}
	return nil
}

// allowedOne judges a, one address ip stands for (ip itself, or an IPv4
// it carries).
func (p *Policy) allowedOne(host string, byName bool, ip, a netip.Addr) error {
	what := a.String()
	if a != ip {
		what = fmt.Sprintf("%s (carrying %s)", ip, a)
	}
	if p.Default() {
		if in(DefaultDeny, a) {
			return fmt.Errorf("%w %s: link-local, metadata, unspecified or multicast addresses are refused (set --target-allow to allow it)", ErrRefused, what)
		}
		return nil
	}
	if byName && in(DefaultDeny, a) {
		return fmt.Errorf("%w %s for %s: a host name in --target-allow never reaches link-local, metadata, unspecified or multicast addresses", ErrRefused, what, host)
	}
	if in(p.allow, a) {
		return nil
	}
	if byName {
		if in(NotPublic, a) {
			return fmt.Errorf("%w %s for %s: a host name in --target-allow reaches public addresses only; list the address or its CIDR to allow a loopback or private one", ErrRefused, what, host)
		}
		return nil
	}
	return fmt.Errorf("%w %s: not in --target-allow", ErrRefused, what)
}

func in(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, pr := range prefixes {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// Carried returns the addresses ip stands for: the IPv4 addresses an IPv6
// address carries (IPv4-mapped, IPv4-translated, IPv4-compatible, NAT64,
// 6to4, Teredo; every candidate where the layout is ambiguous), or ip
// itself when it carries none.
func Carried(ip netip.Addr) []netip.Addr {
	ip = ip.Unmap().WithZone("")
	if !ip.Is6() {
		return []netip.Addr{ip}
	}
	b := ip.As16()
	v4 := func(i ...int) netip.Addr { return netip.AddrFrom4([4]byte{b[i[0]], b[i[1]], b[i[2]], b[i[3]]}) }
	zero := func(from, to int) bool {
		for _, c := range b[from:to] {
			if c != 0 {
				return false
			}
		}
		return true
	}
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(ip): // NAT64 well-known prefix
		return []netip.Addr{v4(12, 13, 14, 15)}
	case netip.MustParsePrefix("64:ff9b:1::/48").Contains(ip):
		// NAT64 local use: the operator's prefix is /48, /56, /64 or /96,
		// so any of those layouts may hold the IPv4. A candidate in
		// 0.0.0.0/8 is the zero bits of a longer prefix, not a
		// destination, unless every layout gives one.
		all := []netip.Addr{v4(12, 13, 14, 15), v4(9, 10, 11, 12), v4(7, 9, 10, 11), v4(6, 7, 9, 10)}
		var out []netip.Addr
		for _, a := range all {
			if a.As4()[0] != 0 {
				out = append(out, a)
			}
		}
		if len(out) == 0 {
			return all[:1]
		}
		return out
	case netip.MustParsePrefix("2002::/16").Contains(ip): // 6to4
		return []netip.Addr{v4(2, 3, 4, 5)}
	case netip.MustParsePrefix("2001::/32").Contains(ip): // Teredo: server, then client (inverted)
		c := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return []netip.Addr{v4(4, 5, 6, 7), c}
	case zero(0, 8) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0: // IPv4-translated ::ffff:0:a.b.c.d
		return []netip.Addr{v4(12, 13, 14, 15)}
	case zero(0, 12) && b[12] != 0: // IPv4-compatible ::a.b.c.d (not ::, ::1)
		return []netip.Addr{v4(12, 13, 14, 15)}
	}
	return []netip.Addr{ip}
}

// Control is a net.Dialer Control function enforcing p on the address
// about to be connected (after resolution), for a target named by an IP
// or an unlisted name (Allowed).
func (p *Policy) Control(network, address string, c syscall.RawConn) error {
	return p.controlFor("")(network, address, c)
}

// controlFor is the Control function of a dial for a target named host.
func (p *Policy) controlFor(host string) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		h, _, err := net.SplitHostPort(address)
		if err != nil {
			return fmt.Errorf("%w: %q: %v", ErrRefused, address, err)
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			return fmt.Errorf("%w: %q is not an IP", ErrRefused, h)
		}
		return p.AllowedFor(host, ip)
	}
}

// DialContext returns base's DialContext with p enforced on every address
// connected, after DNS: a listed host name by the rules for names,
// anything else as Allowed. base is copied, not changed (nil: a zero
// net.Dialer); its Resolver, if any, resolves names.
func (p *Policy) DialContext(base *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var plain net.Dialer
	if base != nil {
		plain = *base
	}
	prev := plain.Control
	dialer := func(host string) *net.Dialer {
		d := plain
		check := p.controlFor(host)
		d.Control = func(network, address string, c syscall.RawConn) error {
			if err := check(network, address, c); err != nil {
				return err
			}
			if prev != nil {
				return prev(network, address, c)
			}
			return nil
		}
		return &d
	}
	checked := dialer("")
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, _, err := net.SplitHostPort(addr); err == nil && p.Listed(host) {
			return dialer(host).DialContext(ctx, network, addr)
		}
		return checked.DialContext(ctx, network, addr)
	}
}
