//go:build linux

package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The lab's addresses: 198.18.0.0/15 is reserved for network benchmark
// tests (RFC 2544) and lives only inside namespaces the run creates, behind
// a bridge in a namespace of its own; nothing is added to the root
// namespace, so no test packet can leave the machine.
const (
	labSubnetBits = 16
	hubIP         = "198.18.0.1" // the bridge: delivery target and load generator
	maxNodes      = 50_000       // every join is a new node: about one a minute
	apiPort       = 8080
	gossipPort    = 7946
	targetPort    = 9000
)

// nsPrefix starts every namespace a run creates: "fsc-<pid>-". A later run
// deletes namespaces whose pid is gone (a run killed before its cleanup).
const nsPrefix = "fsc-"

var nsNameRE = regexp.MustCompile(`^fsc-(\d+)-`)

// netLab is one run's network: a hub namespace holding a bridge (and the
// address the test process uses, through setns) and one namespace per node,
// each joined to the bridge by a veth pair. Faults are nftables rules inside
// the node namespaces, so they survive a node's restart and never touch
// traffic outside the lab. Safe for concurrent use.
type netLab struct {
	prefix string // fsc-<pid>-
	hub    string // hub namespace name
	hubNS  *os.File
	rootNS *os.File

	mu    sync.Mutex
	hosts []string // namespaces created, hub first
}

// newNetLab deletes namespaces left by dead runs, then creates the hub and
// its bridge. It fails when ip(8) cannot create namespaces (not root).
func newNetLab() (*netLab, error) {
	sweepStaleNamespaces()
	l := &netLab{prefix: fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())}
	l.hub = l.prefix + "hub"
	root, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("open root netns: %w", err)
	}
	l.rootNS = root
	if err := l.addNamespace(l.hub); err != nil {
		l.close()
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", l.hub, "link", "add", "br0", "type", "bridge"},
		{"-n", l.hub, "addr", "add", fmt.Sprintf("%s/%d", hubIP, labSubnetBits), "dev", "br0"},
		{"-n", l.hub, "link", "set", "br0", "up"},
	} {
		if err := runCmd("ip", args...); err != nil {
			l.close()
			return nil, err
		}
	}
	f, err := os.Open("/var/run/netns/" + l.hub)
	if err != nil {
		l.close()
		return nil, fmt.Errorf("open hub netns: %w", err)
	}
	l.hubNS = f
	return l, nil
}

func (l *netLab) addNamespace(name string) error {
	if err := runCmd("ip", "netns", "add", name); err != nil {
		return err
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, name)
	l.mu.Unlock()
	return runCmd("ip", "-n", name, "link", "set", "lo", "up")
}

// nodeIP is the address of the i-th node (1-based): 198.18.0.(10+i) for
// the first 200, then 198.18.1.11 and so on.
func nodeIP(i int) string { return fmt.Sprintf("198.18.%d.%d", (i-1)/200, 10+(i-1)%200+1) }

// addHost creates the namespace of node i (1-based), wires it to the bridge
// and returns the namespace name and its address.
func (l *netLab) addHost(i int) (ns, ip string, err error) {
	if i < 1 || i > maxNodes {
		return "", "", fmt.Errorf("node index %d out of 1..%d", i, maxNodes)
	}
	ns = fmt.Sprintf("%sn%d", l.prefix, i)
	ip = nodeIP(i)
	if err := l.addNamespace(ns); err != nil {
		return "", "", err
	}
	veth := fmt.Sprintf("v%d", i)
	for _, args := range [][]string{
		{"-n", l.hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", l.hub, "link", "set", veth, "master", "br0", "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip, labSubnetBits), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
	} {
		if err := runCmd("ip", args...); err != nil {
			return "", "", err
		}
	}
	return ns, ip, nil
}

// setRules replaces the nftables ruleset of namespace ns by a chaos table
// holding rules in its input hook; empty rules remove every rule. Faults
// drop packets on arrival only: the sender's write succeeds and the packet
// vanishes, as on a real network (a drop in the output hook would fail the
// sender's write with EPERM at once, which no real partition does).
func (l *netLab) setRules(ns string, rules nsRules) error {
	text := "flush ruleset\n"
	if !rules.empty() {
		text += "table inet chaos {\n" +
			"  chain input { type filter hook input priority 0; policy accept;\n" + strings.Join(rules.input, "\n") + "\n  }\n" +
			"}\n"
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %v: %s\nruleset:\n%s", ns, err, bytes.TrimSpace(out), text)
	}
	return nil
}

// nsRules are nftables statements for the input hook of one node namespace.
type nsRules struct{ input []string }

func (r nsRules) empty() bool { return len(r.input) == 0 }

// cutFrom drops every packet arriving from the given node addresses. A
// partition gives each side the rule against the other, so both directions
// are cut.
func (r *nsRules) cutFrom(ips []string) {
	if len(ips) == 0 {
		return
	}
	r.input = append(r.input, "    ip saddr { "+strings.Join(ips, ", ")+" } drop")
}

// loseFromNodes drops pct % of the packets arriving from other nodes (not
// from the hub: the target and the load generator are not behind the
// faulty link). Applied on every node, each direction of a node pair loses
// pct %.
func (r *nsRules) loseFromNodes(pct int) {
	r.input = append(r.input, fmt.Sprintf("    ip saddr %s/%d ip saddr != %s numgen random mod 100 < %d drop", hubIP, labSubnetBits, hubIP, pct))
}

// inHub runs fn on an OS thread switched into the hub namespace: sockets
// fn creates (listeners, dialled connections) belong to the lab's network
// and keep working from any goroutine afterwards.
func (l *netLab) inHub(fn func() error) error {
	runtime.LockOSThread()
	if err := setns(l.hubNS); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns into %s: %w", l.hub, err)
	}
	ferr := fn()
	if err := setns(l.rootNS); err != nil {
		// The thread stays locked and in the hub namespace; it must never
		// serve another goroutine. Stop the run: nothing can be trusted.
		panic(fmt.Sprintf("chaos: setns back to the root namespace: %v", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// dialContext is an http.Transport DialContext that connects from the hub.
func (l *netLab) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	err := l.inHub(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// listen opens a TCP listener on the hub address.
func (l *netLab) listen(port int) (net.Listener, error) {
	var ln net.Listener
	err := l.inHub(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(hubIP, strconv.Itoa(port)))
		return err
	})
	return ln, err
}

// close deletes every namespace the lab created (their veths and rules go
// with them). Safe to call more than once.
func (l *netLab) close() {
	l.mu.Lock()
	hosts := l.hosts
	l.hosts = nil
	l.mu.Unlock()
	for i := len(hosts) - 1; i >= 0; i-- {
		_ = runCmd("ip", "netns", "del", hosts[i])
	}
	if l.hubNS != nil {
		_ = l.hubNS.Close()
	}
	if l.rootNS != nil {
		_ = l.rootNS.Close()
	}
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// sweepStaleNamespaces deletes fsc-<pid>-* namespaces whose run (pid) is
// gone, hub last.
func sweepStaleNamespaces() {
	ents, err := os.ReadDir("/var/run/netns")
	if err != nil {
		return
	}
	var stale []string
	for _, e := range ents {
		m := nsNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		stale = append(stale, e.Name())
	}
	sort.Slice(stale, func(i, j int) bool {
		return !strings.HasSuffix(stale[i], "-hub") && strings.HasSuffix(stale[j], "-hub")
	})
	for _, ns := range stale {
		_ = runCmd("ip", "netns", "del", ns)
	}
}

// labPrerequisites says why this machine cannot run the lab ("" when it
// can): root, ip(8) and nft(8) are needed.
func labPrerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces and nftables)"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("needs %s(8) on PATH (Debian: apt-get install %s; .ci/run installs it)", tool, map[string]string{"ip": "iproute2", "nft": "nftables"}[tool])
		}
	}
	return ""
}

func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
