package cluster

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// AdvertiseChoice is the IP a node bound to every interface (0.0.0.0 or
// ::) advertises to its peers, and how ChooseAdvertiseIP came to it, so the
// caller can log the choice and the flag that overrides it.
type AdvertiseChoice struct {
	// IP is the chosen address (an IP literal).
	IP string
	// Interface is the network interface carrying IP; "" for the loopback
	// fallback.
	Interface string
	// Reason says why IP was chosen: ReasonDefaultRoute,
	// ReasonPrivateAddress or ReasonLoopback.
	Reason string
	// Candidates lists every address of the same standing as IP, IP first:
	// the addresses of the default route's interface, or without a default
	// route every private address. More than one means the choice was
	// ambiguous and the operator should set the address explicitly.
	Candidates []string
}

// Reasons of an AdvertiseChoice.
const (
	// ReasonDefaultRoute: IP is an address of the interface that carries
	// the default route (the lowest metric one), the one peers on other
	// networks reach this host through.
	ReasonDefaultRoute = "address of the default route's interface"
	// ReasonPrivateAddress: there is no default route; IP is the first
	// private address (RFC 1918, RFC 6598 shared space, IPv6 ULA) of an up,
	// non-loopback interface, by interface index.
	ReasonPrivateAddress = "no default route: first private address"
	// ReasonLoopback: no default route and no private address: 127.0.0.1,
	// which only peers on this host can reach.
	ReasonLoopback = "no default route and no private address: loopback"
)

// ChooseAdvertiseIP picks the IP a node bound to every interface advertises
// for its gossip (and, unless set apart, its API): an address of the
// default route's interface, else the first private address, else
// 127.0.0.1. Unlike memberlist's own guess (go-sockaddr's GetPrivateIP,
// which finds the default route by running ip(8) and understands only
// "default via GW dev IF", then prefers the smallest network), it reads
// the kernel's routing table itself (/proc/net/route, /proc/net/ipv6_route;
// on systems without them it behaves as if there were no default route).
// Within the chosen interface IPv4 comes before IPv6 and private before
// public addresses. Errors: the interfaces could not be listed.
func ChooseAdvertiseIP() (AdvertiseChoice, error) {
	ifs, err := listInterfaces()
	if err != nil {
		return AdvertiseChoice{}, fmt.Errorf("list network interfaces to choose an advertise address: %w", err)
	}
	var routes []defaultRoute
	if f, err := os.Open("/proc/net/route"); err == nil {
		r, _ := parseIPv4Routes(f)
		routes = append(routes, r...)
		_ = f.Close()
	}
	if f, err := os.Open("/proc/net/ipv6_route"); err == nil {
		r, _ := parseIPv6Routes(f)
		routes = append(routes, r...)
		_ = f.Close()
	}
	return chooseAdvertise(ifs, routes), nil
}

// netInterface is one network interface and its addresses, the input of
// chooseAdvertise.
type netInterface struct {
	Name     string
	Index    int
	Up       bool
	Loopback bool
	Addrs    []netip.Addr
}

// defaultRoute is one default route of the kernel's table.
type defaultRoute struct {
	Iface  string
	Metric uint64
	IPv6   bool
}

func listInterfaces() ([]netInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]netInterface, 0, len(ifs))
	for _, ifc := range ifs {
		ni := netInterface{Name: ifc.Name, Index: ifc.Index,
			Up: ifc.Flags&net.FlagUp != 0, Loopback: ifc.Flags&net.FlagLoopback != 0}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue // an interface that vanished meanwhile
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				ni.Addrs = append(ni.Addrs, p.Addr().Unmap())
			}
		}
		out = append(out, ni)
	}
	return out, nil
}

// chooseAdvertise is ChooseAdvertiseIP's pure core: it ranks the addresses
// of ifs given the default routes (see ChooseAdvertiseIP).
func chooseAdvertise(ifs []netInterface, routes []defaultRoute) AdvertiseChoice {
	byName := make(map[string]netInterface, len(ifs))
	for _, ifc := range ifs {
		byName[ifc.Name] = ifc
	}
	// IPv4 default routes before IPv6 ones (their metrics are not
	// comparable), each by metric; the best ones (same family, equal
	// lowest metric) all count: two default routes of one metric make the
	// choice ambiguous.
	routes = slices.Clone(routes)
	slices.SortStableFunc(routes, func(a, b defaultRoute) int {
		if a.IPv6 != b.IPv6 {
			if b.IPv6 {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Metric, b.Metric)
	})
	var best []string
	var bestMetric uint64
	var bestIPv6 bool
	for _, r := range routes {
		ifc, ok := byName[r.Iface]
		if !ok || !ifc.Up || ifc.Loopback || len(usable(ifc.Addrs)) == 0 || slices.Contains(best, r.Iface) {
			continue
		}
		if len(best) > 0 && (r.Metric != bestMetric || r.IPv6 != bestIPv6) {
			break
		}
		best, bestMetric, bestIPv6 = append(best, r.Iface), r.Metric, r.IPv6
	}
	if len(best) > 0 {
		var cands []string
		for _, name := range best {
			for _, a := range usable(byName[name].Addrs) {
				cands = append(cands, a.String())
			}
		}
		return AdvertiseChoice{IP: cands[0], Interface: best[0], Reason: ReasonDefaultRoute, Candidates: cands}
	}

	// No default route: the private addresses of up, non-loopback
	// interfaces, by interface index.
	ifs = slices.Clone(ifs)
	slices.SortStableFunc(ifs, func(a, b netInterface) int { return a.Index - b.Index })
	var cands []string
	first := ""
	for _, ifc := range ifs {
		if !ifc.Up || ifc.Loopback {
			continue
		}
		for _, a := range usable(ifc.Addrs) {
			if a.IsPrivate() || sharedAddressSpace.Contains(a) {
				first = cmp.Or(first, ifc.Name)
				cands = append(cands, a.String())
			}
		}
	}
	if len(cands) > 0 {
		return AdvertiseChoice{IP: cands[0], Interface: first, Reason: ReasonPrivateAddress, Candidates: cands}
	}
	return AdvertiseChoice{IP: "127.0.0.1", Reason: ReasonLoopback, Candidates: []string{"127.0.0.1"}}
}

// sharedAddressSpace is RFC 6598's 100.64.0.0/10 (carrier-grade NAT, and
// some container and VPN networks): private in practice, though
// netip.Addr.IsPrivate does not count it.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// usable returns the addresses a peer could reach, ranked: IPv4 before
// IPv6, private before public within each; loopback, link-local,
// multicast and unspecified addresses are left out.
func usable(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.IsValid() && a.IsGlobalUnicast() && !a.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	rank := func(a netip.Addr) int {
		r := 0
		if a.Is6() {
			r += 2
		}
		if !a.IsPrivate() && !sharedAddressSpace.Contains(a) {
			r++
		}
		return r
	}
	slices.SortStableFunc(out, func(a, b netip.Addr) int { return rank(a) - rank(b) })
	return out
}

// parseIPv4Routes reads the default routes of /proc/net/route: lines of
// "Iface Destination Gateway Flags RefCnt Use Metric Mask ...", hex
// fields, a default route having destination and mask 0 and the RTF_UP
// flag.
func parseIPv4Routes(r io.Reader) ([]defaultRoute, error) {
	var out []defaultRoute
	sc := bufio.NewScanner(r)
	header := true
	for sc.Scan() {
		if header {
			header = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 {
			continue
		}
		flags, err1 := strconv.ParseUint(f[3], 16, 32)
		metric, err2 := strconv.ParseUint(f[6], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		const rtfUp = 0x1
		if f[1] == "00000000" && f[7] == "00000000" && flags&rtfUp != 0 {
			out = append(out, defaultRoute{Iface: f[0], Metric: metric})
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read IPv4 routes: %w", err)
	}
	return out, nil
}

// parseIPv6Routes reads the default routes of /proc/net/ipv6_route:
// "dest plen src splen nexthop metric refcnt use flags iface", hex
// fields; a default route has an all-zero destination of length 0, the
// RTF_UP flag and not RTF_REJECT (the kernel's "unreachable" defaults on
// lo).
func parseIPv6Routes(r io.Reader) ([]defaultRoute, error) {
	var out []defaultRoute
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		metric, err1 := strconv.ParseUint(f[5], 16, 64)
		flags, err2 := strconv.ParseUint(f[8], 16, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		const rtfUp, rtfReject = 0x1, 0x200
		if f[0] == strings.Repeat("0", 32) && f[1] == "00" && flags&rtfUp != 0 && flags&rtfReject == 0 && f[9] != "lo" {
			out = append(out, defaultRoute{Iface: f[9], Metric: metric, IPv6: true})
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read IPv6 routes: %w", err)
	}
	return out, nil
}
