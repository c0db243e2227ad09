// Package egress is the delivery targets' egress policy (--target-allow):
// which addresses a delivery may connect to, checked at dial time against
// the address actually dialled (after DNS, so a name that resolves or
// re-resolves to a forbidden address, and numeric forms such as
// 0x7f000001 or 2130706433, are judged by the IP they reach).
//
// Without an allow list (the default) every address is allowed except
// DefaultDeny: link-local (169.254.0.0/16, fe80::/10, which hold the cloud
// metadata endpoints 169.254.169.254 and 169.254.170.2), the other known
// metadata addresses (fd00:ec2::254, 100.100.100.200), unspecified,
// multicast and broadcast addresses. Loopback and private ranges are
// allowed: targets are usually internal services, and a single-host
// set-up delivers to 127.0.0.1. With an allow list, only the addresses in
// its CIDRs, and any address of the host names it lists (trusted by name:
// the name is matched before resolution), are allowed; DefaultDeny then
// applies only outside those entries.
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

// DefaultDeny are the prefixes refused without an allow list.
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
			p.allow = append(p.allow, pr.Masked())
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				p.allow = append(p.allow, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			if !validHostName(e) {
				return nil, fmt.Errorf("%q is not a CIDR, an IP or a host name", e)
			}
			p.hosts[strings.ToLower(strings.TrimSuffix(e, "."))] = true
		}
	}
	return p, nil
}

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

// Allowed reports whether ip may be dialled; nil if so, else an error
// wrapping ErrRefused that names the address and why.
func (p *Policy) Allowed(ip netip.Addr) error {
	ip = ip.Unmap().WithZone("") // a zoned address is never Contained
	if !p.Default() {
		for _, pr := range p.allow {
			if pr.Contains(ip) {
				return nil
			}
		}
		return fmt.Errorf("%w %s: not in --target-allow", ErrRefused, ip)
	}
	for _, pr := range DefaultDeny {
		if pr.Contains(ip) {
			return fmt.Errorf("%w %s: link-local, metadata, unspecified or multicast addresses are refused (set --target-allow to allow it)", ErrRefused, ip)
		}
	}
	return nil
}

// Control is a net.Dialer Control function enforcing p on the address
// about to be connected (after resolution).
func (p *Policy) Control(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrRefused, address, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %q is not an IP", ErrRefused, host)
	}
	return p.Allowed(ip)
}

// DialContext returns base's DialContext with p enforced: a host name in
// the allow list dials as base does; any other address is checked by
// Control when it is connected. base is copied, not changed (nil: a zero
// net.Dialer).
func (p *Policy) DialContext(base *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var plain net.Dialer
	if base != nil {
		plain = *base
	}
	checked := plain
	prev := plain.Control
	checked.Control = func(network, address string, c syscall.RawConn) error {
		if err := p.Control(network, address, c); err != nil {
			return err
		}
		if prev != nil {
			return prev(network, address, c)
		}
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p != nil && len(p.hosts) > 0 {
			if host, _, err := net.SplitHostPort(addr); err == nil && p.hosts[strings.ToLower(strings.TrimSuffix(host, "."))] {
				return plain.DialContext(ctx, network, addr)
			}
		}
		return checked.DialContext(ctx, network, addr)
	}
}
