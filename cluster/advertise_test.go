package cluster

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// /proc/net/route of a host with two interfaces: eth1 (a /16, which
// go-sockaddr ranks first) and eth0 carrying the default route as a device
// route without a gateway ("default dev eth0"), which go-sockaddr's ip(8)
// parser misses. Columns are tab-separated in the kernel's output.
const procRoute = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
	"eth0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n" +
	"eth0\t0001C70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n" +
	"eth1\t0000C80A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n" +
	"eth2\t00000000\t0102C70A\t0003\t0\t0\t200\t00000000\t0\t0\t0\n" +
	"eth3\t00000000\t0103C70A\t0002\t0\t0\t0\t00000000\t0\t0\t0\n" // not RTF_UP

const procIPv6Route = "" +
	"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n" +
	"fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth4\n" +
	"00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000001 00000000 00000003     eth4\n"

func TestParseDefaultRoutes(t *testing.T) {
	v4, err := parseIPv4Routes(strings.NewReader(procRoute))
	if err != nil {
		t.Fatal(err)
	}
	want4 := []defaultRoute{{Iface: "eth0", Metric: 0}, {Iface: "eth2", Metric: 200}}
	if !slices.Equal(v4, want4) {
		t.Errorf("IPv4 default routes = %+v, want %+v", v4, want4)
	}
	v6, err := parseIPv6Routes(strings.NewReader(procIPv6Route))
	if err != nil {
		t.Fatal(err)
	}
	want6 := []defaultRoute{{Iface: "eth4", Metric: 0x400, IPv6: true}}
	if !slices.Equal(v6, want6) {
		t.Errorf("IPv6 default routes = %+v, want %+v (lo's unreachable default left out)", v6, want6)
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestChooseAdvertise(t *testing.T) {
	lo := netInterface{Name: "lo", Index: 1, Up: true, Loopback: true, Addrs: addrs("127.0.0.1", "::1")}
	eth0 := netInterface{Name: "eth0", Index: 2, Up: true, Addrs: addrs("10.199.1.2", "fe80::1")}
	eth1 := netInterface{Name: "eth1", Index: 3, Up: true, Addrs: addrs("10.199.0.2")}
	for _, tc := range []struct {
		name   string
		ifs    []netInterface
		routes []defaultRoute
		want   AdvertiseChoice
	}{
		{
			name:   "the default route's interface wins over another private interface listed first",
			ifs:    []netInterface{lo, eth1, eth0},
			routes: []defaultRoute{{Iface: "eth0"}},
			want:   AdvertiseChoice{IP: "10.199.1.2", Interface: "eth0", Reason: ReasonDefaultRoute, Candidates: []string{"10.199.1.2"}},
		},
		{
			name: "two addresses on the default interface: IPv4 private first, both candidates",
			ifs: []netInterface{lo, eth1, {Name: "eth0", Index: 2, Up: true,
				Addrs: addrs("2001:db8::5", "203.0.113.7", "10.199.1.20", "10.199.1.2")}},
			routes: []defaultRoute{{Iface: "eth0"}},
			want: AdvertiseChoice{IP: "10.199.1.20", Interface: "eth0", Reason: ReasonDefaultRoute,
				Candidates: []string{"10.199.1.20", "10.199.1.2", "203.0.113.7", "2001:db8::5"}},
		},
		{
			name:   "lowest metric wins; an IPv6 default only when no IPv4 one is usable",
			ifs:    []netInterface{lo, eth0, eth1, {Name: "eth4", Index: 5, Up: true, Addrs: addrs("fd00::2")}},
			routes: []defaultRoute{{Iface: "eth4", IPv6: true}, {Iface: "eth0", Metric: 100}, {Iface: "eth1", Metric: 50}},
			want:   AdvertiseChoice{IP: "10.199.0.2", Interface: "eth1", Reason: ReasonDefaultRoute, Candidates: []string{"10.199.0.2"}},
		},
		{
			name:   "two default routes of one metric are ambiguous",
			ifs:    []netInterface{lo, eth0, eth1},
			routes: []defaultRoute{{Iface: "eth1", Metric: 10}, {Iface: "eth0", Metric: 10}},
			want:   AdvertiseChoice{IP: "10.199.0.2", Interface: "eth1", Reason: ReasonDefaultRoute, Candidates: []string{"10.199.0.2", "10.199.1.2"}},
		},
		{
			name:   "IPv6-only default route",
			ifs:    []netInterface{lo, {Name: "eth4", Index: 5, Up: true, Addrs: addrs("fe80::2", "fd00::2")}},
			routes: []defaultRoute{{Iface: "eth4", IPv6: true, Metric: 1024}},
			want:   AdvertiseChoice{IP: "fd00::2", Interface: "eth4", Reason: ReasonDefaultRoute, Candidates: []string{"fd00::2"}},
		},
		{
			name: "a default route on a down interface or one without addresses does not count",
			ifs: []netInterface{lo, eth1, eth0, {Name: "eth9", Index: 9, Addrs: addrs("10.9.9.9")},
				{Name: "tun0", Index: 10, Up: true}},
			routes: []defaultRoute{{Iface: "eth9"}, {Iface: "tun0"}, {Iface: "gone"}},
			want:   AdvertiseChoice{IP: "10.199.1.2", Interface: "eth0", Reason: ReasonPrivateAddress, Candidates: []string{"10.199.1.2", "10.199.0.2"}},
		},
		{
			name: "no default route: private addresses by interface index, shared space included, public left out",
			ifs: []netInterface{lo, {Name: "wg0", Index: 7, Up: true, Addrs: addrs("100.64.3.4")},
				{Name: "eth0", Index: 2, Up: true, Addrs: addrs("198.51.100.4")}},
			want: AdvertiseChoice{IP: "100.64.3.4", Interface: "wg0", Reason: ReasonPrivateAddress, Candidates: []string{"100.64.3.4"}},
		},
		{
			name: "nothing but loopback",
			ifs:  []netInterface{lo},
			want: AdvertiseChoice{IP: "127.0.0.1", Reason: ReasonLoopback, Candidates: []string{"127.0.0.1"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := chooseAdvertise(tc.ifs, tc.routes)
			if got.IP != tc.want.IP || got.Interface != tc.want.Interface || got.Reason != tc.want.Reason ||
				!slices.Equal(got.Candidates, tc.want.Candidates) {
				t.Errorf("chooseAdvertise = %+v\n                   want %+v", got, tc.want)
			}
		})
	}
}

// On this machine the real reader gives some usable answer: an IP literal
// among the candidates.
func TestChooseAdvertiseIPOnThisHost(t *testing.T) {
	ch, err := ChooseAdvertiseIP()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netip.ParseAddr(ch.IP); err != nil || !slices.Contains(ch.Candidates, ch.IP) {
		t.Fatalf("ChooseAdvertiseIP = %+v", ch)
	}
	t.Logf("this host advertises %s (%s, %s; candidates %v)", ch.IP, ch.Interface, ch.Reason, ch.Candidates)
}
