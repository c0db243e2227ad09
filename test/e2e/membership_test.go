package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/loadgen"
)

// TestWholeClusterStopsTogether: a whole cluster stopped at once (SIGTERM
// to every node, as `docker compose down` does). Every node exits 0,
// having delivered what it was given, and none reaches the end of its
// grace (20 s here) first: no node logs that its leave went past the
// grace or that its shutdown was incomplete (a node waiting for a leave
// broadcast nobody could receive, or for peers that are all leaving too,
// would). How long each took is logged.
func TestWholeClusterStopsTogether(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	var nodes []*proc
	for i := range 3 {
		nodes = append(nodes, c.startNode(fmt.Sprintf("stop-%d", i)))
	}
	c.waitConverged(20 * time.Second)
	l := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(l, loadgen.Config{Rows: 600, BatchSize: 50, KeyPrefix: "stop-",
		Namespaces: []loadgen.Namespace{{Name: "stop", Weight: 1}}}))
	if rep.Appended != 600 || rep.GaveUp != 0 {
		t.Fatalf("appended %d of 600 (%d given up)", rep.Appended, rep.GaveUp)
	}
	c.waitDelivered(l, recv, 30*time.Second)

	const grace = 20 * time.Second // baseNodeFlags' --shutdown-grace
	type result struct {
		name string
		code int
		took time.Duration
	}
	results := make([]result, len(nodes))
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range nodes {
		done, ok := p.signal(syscall.SIGTERM)
		if !ok {
			t.Fatalf("%s is not running", p.name)
		}
		wg.Go(func() {
			select {
			case <-done:
				results[i] = result{p.name, p.exitStatus(), time.Since(start)}
			case <-time.After(grace + 10*time.Second):
				results[i] = result{p.name, -3, time.Since(start)}
				p.kill()
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		t.Logf("%s exited %d after %v", r.name, r.code, r.took.Round(time.Millisecond))
		if r.code != 0 {
			t.Errorf("%s exited %d after %v; want 0", r.name, r.code, r.took.Round(time.Millisecond))
		}
	}
	for _, p := range nodes {
		log := testnode.TailFile(p.logPath, 400)
		for _, bad := range []string{"graceful shutdown incomplete", "leave incomplete after --shutdown-grace"} {
			if strings.Contains(log, bad) {
				t.Errorf("%s logged %q:\n%s", p.name, bad, testnode.TailFile(p.logPath, 30))
			}
		}
	}
}

// Two nodes started with one --node-name (the default is the hostname, so
// two containers or VMs cloned from one image collide) must not both become
// ready and each own every shard. The newcomer is refused at join: it exits
// 1 saying the name is used by a live member and pointing at --node-name,
// and the cluster's view (members, their addresses, ownership) does not
// change.
func TestDuplicateNodeNameRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 256})
	for i := range 3 {
		c.startNode(fmt.Sprintf("dup-%d", i))
	}
	c.waitConverged(20 * time.Second)
	before := c.clusterViews()

	// Same name as dup-1, its own address, data dir and log.
	twin := c.startNode("dup-1", expectRefusal(), func(p *proc) {
		p.dataDir = filepath.Join(p.c.dir, "dup-1-twin", "data")
		p.logPath = filepath.Join(p.c.dir, "dup-1-twin.log")
	})
	t.Logf("the twin's last words:\n%s", testnode.TailFile(twin.logPath, 4))
	if code := twin.exitStatus(); code != 1 {
		t.Errorf("the second dup-1 exited with %d; want 1", code)
	}
	log := testnode.TailFile(twin.logPath, 60)
	for _, want := range []string{`node name "dup-1" is already used by a live member`, "--node-name"} {
		if !strings.Contains(log, want) {
			t.Errorf("the second dup-1's last words lack %q:\n%s", want, log)
		}
	}
	poll.Consistently(t, 2*time.Second, "the cluster's view with the first dup-1 only", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			b := before[p.name]
			if v.OwnershipVersion != b.OwnershipVersion || memberSet(v) != memberSet(b) {
				return false, fmt.Sprintf("%s: ownership_version %d → %d, members %s → %s",
					p.name, b.OwnershipVersion, v.OwnershipVersion, memberSet(b), memberSet(v))
			}
			for _, m := range v.Members {
				if m.Name == "dup-1" && m.GossipAddr != c.members()[1].gossipAddr {
					return false, fmt.Sprintf("%s holds dup-1 at %s", p.name, m.GossipAddr)
				}
			}
		}
		return true, ""
	})
}

// The gossip key rotated on a live cluster of real nodes, the documented
// way: each node reads its keys from --gossip-key-file and takes a new list
// on SIGHUP; the three steps (install K2 beside K1, make K2 primary, remove
// K1) each go to every node, one node at a time with a second of gossip and
// push/pull in the mixed state, and the next step starts once every node's
// /v1/cluster lists every member with the step's key fingerprints.
// Throughout, polled every 50 ms, every node sees all three members, all
// active, and no node logs a packet or state it could not decrypt.
// Afterwards a node with only K1 is refused (exit 1) and a node with K2
// joins.
func TestGossipKeyRotationByReload(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 256})
	k1, k2 := randomKey(t), randomKey(t)
	keyFile := func(name string) string { return filepath.Join(c.dir, name+".keys") }
	writeKeys := func(name string, keys ...string) {
		t.Helper()
		tmp := keyFile(name) + ".tmp"
		body := "# gossip keys, primary first\n" + strings.Join(keys, "\n") + "\n"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, keyFile(name)); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []*proc
	for i := range 3 {
		name := fmt.Sprintf("rot-%d", i)
		writeKeys(name, k1)
		nodes = append(nodes, c.startNode(name, withFlags("--gossip-key-file", keyFile(name))))
	}
	c.waitConverged(20 * time.Second)

	// The watch: every 50 ms every node must see three active members.
	var (
		mu    sync.Mutex
		drops []string
		polls int
	)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, p := range nodes {
				v, err := c.clusterView(p)
				mu.Lock()
				polls++
				if err != nil {
					drops = append(drops, err.Error())
				} else if got := memberSet(v); got != "rot-0:active,rot-1:active,rot-2:active" {
					drops = append(drops, fmt.Sprintf("%s saw %s at %s", p.name, got, time.Now().Format(time.StampMilli)))
				}
				mu.Unlock()
			}
		}
	}()

	keysEverywhere := func(keys ...string) {
		t.Helper()
		var fps []string
		for _, k := range keys {
			fps = append(fps, fingerprint(t, k))
		}
		want := strings.Join(fps, ",")
		poll.Eventually(t, deadline(20*time.Second), "every node lists keys "+want+" for every member", func() (bool, string) {
			for _, p := range nodes {
				v, err := c.clusterView(p)
				if err != nil {
					return false, err.Error()
				}
				for _, m := range v.Members {
					if got := strings.Join(m.GossipKeys, ","); got != want {
						return false, fmt.Sprintf("%s lists %s with keys %s", p.name, m.Name, got)
					}
				}
			}
			return true, ""
		})
	}
	keysEverywhere(k1)
	for _, step := range [][]string{{k1, k2}, {k2, k1}, {k2}} {
		for _, p := range nodes {
			writeKeys(p.name, step...)
			if _, ok := p.signal(syscall.SIGHUP); !ok {
				t.Fatalf("%s is not running", p.name)
			}
			time.Sleep(time.Second) // gossip and a push/pull (1 s) in the mixed state
		}
		keysEverywhere(step...)
	}
	time.Sleep(2 * time.Second) // push/pull rounds with K1 gone
	close(stop)
	<-watched
	mu.Lock()
	t.Logf("%d polls of /v1/cluster during the rotation", polls)
	if len(drops) > 0 {
		t.Errorf("a node was cut off during the rotation (%d bad polls), first: %v", len(drops), drops[:min(3, len(drops))])
	}
	mu.Unlock()
	for _, p := range nodes {
		if !p.running() {
			t.Fatalf("%s exited during the rotation (SIGHUP must not stop it): %d", p.name, p.exitStatus())
		}
		log := strings.ToLower(testnode.TailFile(p.logPath, 2000))
		if n := strings.Count(log, "decrypt"); n > 0 {
			t.Errorf("%s logged %d decryption failures", p.name, n)
		}
		if n := strings.Count(log, "gossip keys reloaded"); n != 3 {
			t.Errorf("%s logged %d key reloads, want 3", p.name, n)
		}
	}

	stale := c.startNode("rot-stale", expectRefusal(), withFlags("--gossip-key", k1, "--join-wait", "2s"))
	if code := stale.exitStatus(); code != 1 {
		t.Errorf("a node with only the removed key exited %d; want 1", code)
	}
	if log := testnode.TailFile(stale.logPath, 40); !strings.Contains(log, "could not exchange state") {
		t.Errorf("the node with the removed key does not say why it stopped:\n%s", log)
	}
	c.startNode("rot-new", withFlags("--gossip-key", k2))
	c.waitConverged(20 * time.Second)
}

func randomKey(t *testing.T) string {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

// fingerprint is how /v1/cluster names a gossip key: the first 4 bytes of
// its SHA-256, in hex.
func fingerprint(t *testing.T, b64 string) string {
	k, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(k)
	return hex.EncodeToString(sum[:4])
}
