//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testnode"
)

// A node bound to 0.0.0.0 on a host with two private addresses must
// advertise one its peers can reach, or the two nodes' tables disagree. Two
// network namespaces, joined by a veth pair:
//
//	ns a: adv0 10.231.1.2/24 and 10.231.1.20/24, default route "dev adv0"
//	      (a device route without a gateway, as on point-to-point and some
//	      cloud links); adv1 10.232.0.2/16, a larger network peers cannot
//	      reach (ns b has no route to it)
//	ns b: advb 10.231.1.3/24, no default route
//
// Node a binds --gossip-addr 0.0.0.0:7946 and --http-addr :8080 and guesses;
// node b binds 10.231.1.3 and joins 10.231.1.2:7946. memberlist's own guess
// (go-sockaddr: ip(8)'s "default via" lines only, then the shortest
// netmask first) picked 10.232.0.2. Now node a advertises an address of the default
// route's interface, warns that two were possible naming the chosen one and
// --advertise-gossip, both nodes converge on one table, and /v1/cluster on
// either shows each member's advertised gossip and API addresses. Needs
// root and ip(8); all traffic stays inside the two namespaces.
func TestAdvertisedAddressIsTheDefaultRoutesOnTwoInterfaces(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: runs real processes; skipped with -short")
	}
	nsA, nsB := netnsPair(t)
	dir := t.TempDir()

	a := startInNetns(t, nsA, dir, "adv-a",
		"--gossip-addr", "0.0.0.0:7946", "--http-addr", ":8080")
	b := startInNetns(t, nsB, dir, "adv-b",
		"--gossip-addr", "10.231.1.3:7946", "--http-addr", "10.231.1.3:8080", "--join", "10.231.1.2:7946")
	clientA, clientB := netnsClient(t, nsA), netnsClient(t, nsB)
	apiA, apiB := "http://10.231.1.2:8080", "http://10.231.1.3:8080"

	wantMembers := map[string][2]string{
		"adv-a": {"10.231.1.2:7946", "10.231.1.2:8080"},
		"adv-b": {"10.231.1.3:7946", "10.231.1.3:8080"},
	}
	var tables [2][]string
	poll.Eventually(t, deadline(30*time.Second), "both nodes list both members at their advertised addresses, with one table", func() (bool, string) {
		for i, p := range []struct {
			c   *http.Client
			api string
			log string
		}{{clientA, apiA, a}, {clientB, apiB, b}} {
			var v clusterView
			if err := getJSONWith(p.c, p.api+"/v1/cluster", &v); err != nil {
				return false, fmt.Sprintf("%v; log:\n%s", err, testnode.TailFile(p.log, 10))
			}
			if len(v.Members) != len(wantMembers) {
				return false, fmt.Sprintf("%s sees %s", v.Node, memberSet(v))
			}
			for _, m := range v.Members {
				if w := wantMembers[m.Name]; m.GossipAddr != w[0] || m.APIAddr != w[1] || m.State != "active" {
					return false, fmt.Sprintf("%s sees %s at gossip %s, API %s, %s; want %s, %s, active",
						v.Node, m.Name, m.GossipAddr, m.APIAddr, m.State, w[0], w[1])
				}
			}
			var st struct {
				Shards []struct {
					Owner string `json:"owner"`
				} `json:"shards"`
			}
			if err := getJSONWith(p.c, p.api+"/v1/shards", &st); err != nil {
				return false, err.Error()
			}
			tables[i] = nil
			for _, s := range st.Shards {
				tables[i] = append(tables[i], s.Owner)
			}
		}
		if !slices.Equal(tables[0], tables[1]) {
			return false, "the two shard tables differ"
		}
		if !slices.Contains(tables[0], "adv-a") || !slices.Contains(tables[0], "adv-b") {
			return false, "a node owns no shard"
		}
		return true, ""
	})

	log := testnode.TailFile(a, 400)
	var line string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "several addresses could be advertised") {
			line = l
		}
	}
	for _, want := range []string{"ip=10.231.1.2 ", "interface=adv0", "candidates=10.231.1.2,10.231.1.20", "--advertise-gossip", "default route"} {
		if !strings.Contains(line, want) {
			t.Errorf("adv-a's warning about its advertised address lacks %q:\n%q", want, line)
		}
	}
}

// netnsPair creates the two namespaces of the test (removed at cleanup)
// and returns their names; it skips the test where that is not possible.
func netnsPair(t *testing.T) (string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) to create network namespaces")
	}
	nsA := fmt.Sprintf("fsadv-%d-a", os.Getpid())
	nsB := fmt.Sprintf("fsadv-%d-b", os.Getpid())
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("netns", "add", nsA); err != nil {
		t.Skipf("cannot create a network namespace here: %v", err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", nsA) })
	if err := ip("netns", "add", nsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", nsB) })
	for _, cmd := range [][]string{
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
		{"-n", nsA, "link", "add", "adv0", "type", "veth", "peer", "name", "advb", "netns", nsB},
		{"-n", nsA, "addr", "add", "10.231.1.2/24", "dev", "adv0"},
		{"-n", nsA, "addr", "add", "10.231.1.20/24", "dev", "adv0"},
		{"-n", nsA, "link", "set", "adv0", "up"},
		{"-n", nsA, "route", "add", "default", "dev", "adv0"},
		{"-n", nsA, "link", "add", "adv1", "type", "veth", "peer", "name", "adv1p"},
		{"-n", nsA, "addr", "add", "10.232.0.2/16", "dev", "adv1"},
		{"-n", nsA, "link", "set", "adv1", "up"},
		{"-n", nsA, "link", "set", "adv1p", "up"},
		{"-n", nsB, "addr", "add", "10.231.1.3/24", "dev", "advb"},
		{"-n", nsB, "link", "set", "advb", "up"},
	} {
		if err := ip(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	return nsA, nsB
}

// startInNetns starts a node inside network namespace ns (ip netns exec
// execs the binary, so the process is the node itself), kills it at
// cleanup, and returns its log path.
func startInNetns(t *testing.T, ns, dir, name string, flags ...string) string {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	args := append([]string{"netns", "exec", ns, fairshardBin, "serve",
		"--node-name", name, "--data-dir", filepath.Join(dir, name), "--shards", "64",
		// Beyond loopback a node needs a gossip key beside the cluster
		// secret of baseNodeFlags.
		"--gossip-key", "YWR2ZXJ0aXNlLXRlc3Qta2V5LTMyLWJ5dGVzLi4uLi4="}, baseNodeFlags...)
	args = append(args, flags...)
	p, err := testnode.Launch(testnode.Spec{Name: name, Path: "ip", Args: args, LogPath: logPath, Start: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("---- tail of %s's log ----\n%s", name, testnode.TailFile(logPath, 40))
		}
	})
	return logPath
}

// netnsClient is an HTTP client whose connections are opened inside
// network namespace ns: each dial runs on an OS thread switched into ns
// with setns(2) and switched back afterwards (a thread that cannot switch
// back is left locked, so it dies with its goroutine). The socket keeps
// the namespace it was created in.
func netnsClient(t *testing.T, ns string) *http.Client {
	t.Helper()
	path := "/run/netns/" + ns
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer self.Close()
			target, err := os.Open(path)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer target.Close()
			if err := setns(target); err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", path, err)}
				return
			}
			c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
			if setns(self) == nil {
				runtime.UnlockOSThread()
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

func getJSONWith(c *http.Client, url string, out any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d %s", url, resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}
