package compose

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// heldNamespace is paused for most of the run: its rows stay pending, so
// scale-out, scale-in and the kill have a real backlog to move (or keep)
// and the test can count it on every replica.
const (
	heldNamespace = "held"
	heldRows      = 2000
)

// TestComposeScaleKillDrain runs the repository's docker-compose.yml the way
// a user does, in the order below, and checks that nothing acknowledged is
// lost:
//
//  1. `up -d --no-build --scale node=3 node target`: 3 replicas healthy,
//     agreeing on members and one shard table.
//  2. The held namespace is paused and 2,000 rows appended to it.
//  3. Under load (the steady namespace, through the published ports), scale
//     to 5: all healthy and agreeing, every replica holds held rows (handoff
//     moved them), every acknowledged steady row delivered, 0 duplicates.
//  4. Under load, scale to 2: each removed replica got SIGTERM only, exited
//     0 within stop_grace_period after logging a graceful stop, and the 2
//     survivors hold all 2,000 held rows; no new duplicate.
//  5. Under load, `docker kill` one of the 2 replicas, wait until the other
//     counts it gone, `up` again with the same scale: the same container
//     comes back with the same slot dir (not one of the 3 slots the
//     scale-in left free), node name and held rows (its pending count and
//     sampled keys read through its own port); duplicates at most the rows
//     it may have had claimed (its quota) or settled without the other
//     replica's acknowledgement (see the bound where it is computed).
//  6. Unpause: every acknowledged row of the run delivered, no duplicate
//     but the kill's.
//  7. `--profile demo down -v` exits 0 within stop_grace_period; every node
//     got SIGTERM alone, exited 0 and logged a graceful stop (the whole
//     cluster stopping at once); nothing of the project left (containers,
//     network, volume).
func TestComposeScaleKillDrain(t *testing.T) {
	requireEngine(t)
	testStart := time.Now()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lockHost(t))
	s := newStack(t, root)
	s.removeStale()
	t.Cleanup(buildImage(t, root))
	grace := s.stopGracePeriod()
	s.events = watchEvents(t, s.project)
	t.Cleanup(s.events.close)
	downDone := false
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := s.compose(time.Minute, "logs", "--no-color", "--timestamps", "--tail", "40", "node", "target")
			t.Logf("last log lines of every container:\n%s", out)
		}
		if !downDone {
			if _, err := s.compose(3*time.Minute, "--profile", "demo", "down", "--volumes", "--timeout", "5"); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	t.Logf("compose project %s, stop_grace_period %v", s.project, grace)

	// 1. Three replicas. The init service generated the API token; the
	// published API refuses a call without it.
	s.up(3)
	s.apiToken()
	reps := s.waitCluster(3, false, 2*time.Minute)
	first := reps[0].URL
	for _, r := range reps {
		if st, err := s.unauthenticated("GET", r.URL, "/v1/cluster"); err != nil || st != http.StatusUnauthorized {
			t.Fatalf("GET %s/v1/cluster without the token: HTTP %d %v, want 401: compose must not publish an open API", r.URL, st, err)
		}
	}

	// 2. A paused namespace with a backlog.
	if err := s.do("PUT", first, "/v1/namespaces/"+heldNamespace, map[string]any{"paused": true}, nil); err != nil {
		t.Fatal(err)
	}
	s.waitPaused(reps, true)
	held := newLedger()
	g, err := loadgen.NewGenerator(loadgen.Config{
		Nodes: urls(reps), Token: s.secrets.APIToken, Rows: heldRows, BatchSize: 100, Concurrency: 2,
		KeyPrefix: "held-", Namespaces: []loadgen.Namespace{{Name: heldNamespace, Weight: 1}},
		OnAppended: held.onAppended, OnFailed: held.onFailed,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep, _ := g.Run(t.Context()); rep.Appended != heldRows || rep.GaveUp != 0 || len(held.ackedKeys()) != heldRows {
		t.Fatalf("held: %d of %d rows acknowledged (%d given up, last error %q)", rep.Appended, heldRows, rep.GaveUp, g.LastError())
	}
	s.heldSpread(s.waitCluster(3, true, time.Minute), false)

	// 3. Scale out under load.
	steady := newLedger()
	load := s.startLoad(steady, "out")
	load.waitUnderWay(t, 2*loadRate)
	s.up(5)
	reps = s.waitCluster(5, true, 2*time.Minute)
	load.finish(t, "while scaling 3 → 5")
	s.heldSpread(reps, true)
	c := s.settle(s.expected(steady, reps[0].URL), 2*time.Minute)
	if c.duplicates() != 0 {
		t.Fatalf("scale-out: %d duplicate deliveries, want 0", c.duplicates())
	}
	s.noneDelivered(c, heldNamespace)

	// 4. Scale in under load: the removed replicas drain.
	logs := map[string]*logFollower{}
	for _, r := range reps {
		logs[r.ID] = followLogs(t, r.ID)
	}
	five := reps
	load = s.startLoad(steady, "in")
	load.waitUnderWay(t, 2*loadRate)
	scaleAt := time.Now()
	s.up(2)
	reps = s.waitCluster(2, true, 2*time.Minute)
	load.finish(t, "while scaling 5 → 2")
	var removed []replica
	for _, r := range five {
		if !slices.ContainsFunc(reps, func(k replica) bool { return k.ID == r.ID }) {
			removed = append(removed, r)
		}
	}
	if len(removed) != 3 {
		t.Fatalf("scale-in removed %d replicas, want 3", len(removed))
	}
	for _, r := range removed {
		s.graceful(r, s.events.waitStopped(t, r.ID, scaleAt, grace+30*time.Second), logs[r.ID], grace)
	}
	if total := s.heldSpread(reps, true); total != heldRows {
		t.Fatalf("after scale-in the 2 replicas hold %d held rows, want %d", total, heldRows)
	}
	c = s.settle(s.expected(steady, reps[0].URL), 2*time.Minute)
	if c.duplicates() != 0 {
		t.Fatalf("scale-in: %d duplicate deliveries, want 0", c.duplicates())
	}
	s.noneDelivered(c, heldNamespace)

	// 5. Kill one of the 2 under load; `up` brings it back on its own slot,
	// though the scale-in left 3 others free.
	victim := s.pickVictim(reps)
	before := s.identity(victim)
	quota := int(s.mustNamespace(victim.URL, steadyNamespace).MaxInFlight)
	sample := s.keysOn(held, reps[0].URL, victim.Node, 40)
	t.Logf("victim %s (node %s, %s): %d held rows pending, %d sampled; quota of %s %d",
		victim.Container, victim.Node, before.slot, before.held, len(sample), steadyNamespace, quota)
	load = s.startLoad(steady, "kill")
	load.waitUnderWay(t, 2*loadRate)
	// The bound on duplicates: rows the victim had claimed at the kill (its
	// grant, within the quota in exact mode, the default) and, with
	// replicated shards, its settles the other replica had not yet
	// acknowledged (their new primary delivers them again): the changes
	// unacknowledged at a read just before the kill, plus what it could
	// settle until the kill, at most what it had claimed at the read and
	// what the load appended meanwhile.
	var cv clusterView
	readAt := time.Now()
	if err := s.getJSON(victim.URL, "/v1/cluster", &cv); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	mustDocker(t, time.Minute, nil, "kill", victim.ID)
	window := time.Since(readAt)
	bound := 2*quota + cv.Replication.PendingChanges + int(math.Ceil(loadRate*window.Seconds()))
	rec := s.events.waitStopped(t, victim.ID, killAt, 30*time.Second)
	if !slices.Equal(rec.Signals, []string{"9"}) || rec.ExitCode != "137" {
		t.Fatalf("docker kill %s: %s; want SIGKILL only, exit code 137", victim.Container, rec)
	}
	s.waitGone(victim, reps, time.Minute)
	s.up(2)
	reps = s.waitCluster(2, true, 2*time.Minute)
	load.finish(t, "while one of 2 replicas was killed and started again")
	back := s.byNumber(reps, victim.Number)
	if back.ID != victim.ID || back.Container != victim.Container {
		t.Fatalf("replica %d came back as container %s (%.12s), want the killed %s (%.12s)", victim.Number, back.Container, back.ID, victim.Container, victim.ID)
	}
	after := s.identity(back)
	if after.slot != before.slot || back.Node != victim.Node || after.starts != before.starts+1 {
		t.Fatalf("replica %d came back with slot %s, node %s after %d starts; want slot %s, node %s, %d starts",
			victim.Number, after.slot, back.Node, after.starts, before.slot, victim.Node, before.starts+1)
	}
	if after.held != before.held {
		t.Fatalf("replica %d holds %d held rows after its restart, %d before the kill", victim.Number, after.held, before.held)
	}
	for _, k := range sample {
		v, err := s.row(back.URL, k)
		if err != nil || v.Node != victim.Node || v.Status != "pending" {
			t.Fatalf("row %s through the restarted %s: %+v, %v; want pending on %s", k, back.Container, v, err, victim.Node)
		}
	}
	if total := s.heldSpread(reps, true); total != heldRows {
		t.Fatalf("after the restart the 2 replicas hold %d held rows, want %d", total, heldRows)
	}
	c = s.settle(s.expected(steady, reps[0].URL), 2*time.Minute)
	dupsKill := c.duplicates()
	t.Logf("kill: %d duplicate deliveries (rows the killed replica had claimed or settled without its copy's acknowledgement are delivered again: at most 2 × quota %d + %d unacknowledged changes + %d appended in the %v around the kill = %d)",
		dupsKill, quota, cv.Replication.PendingChanges, bound-2*quota-cv.Replication.PendingChanges, window.Round(time.Millisecond), bound)
	if dupsKill < 0 || dupsKill > bound {
		t.Fatalf("kill: %d duplicate deliveries, more than the %d rows %s could have had claimed or settled unshipped", dupsKill, bound, victim.Container)
	}
	s.noneDelivered(c, heldNamespace)

	// 6. Every acknowledged row delivered.
	if err := s.do("PUT", reps[0].URL, "/v1/namespaces/"+heldNamespace, map[string]any{"paused": false}, nil); err != nil {
		t.Fatal(err)
	}
	want := s.expected(steady, reps[0].URL) + heldRows
	c = s.settle(want, 2*time.Minute)
	if got := c.delivered(heldNamespace); got != heldRows {
		t.Fatalf("held: %d deliveries after the unpause, want %d", got, heldRows)
	}
	if c.duplicates() != dupsKill {
		t.Fatalf("%d duplicate deliveries in all, want the kill's %d", c.duplicates(), dupsKill)
	}
	s.sampleDone(append(held.ackedKeys(), steady.ackedKeys()...), reps[0].URL, 100)

	// 7. down: exit 0 within the grace, every node stopped gracefully. The
	// target was started by naming it, so its profile (demo) must be named
	// for down to remove it and the network.
	for _, r := range reps {
		logs[r.ID] = followLogs(t, r.ID)
	}
	downAt := time.Now()
	if out, err := s.compose(grace+2*time.Minute, "--profile", "demo", "down", "--volumes"); err != nil {
		t.Fatalf("docker compose --profile demo down -v: %v (want exit 0)\n%s", err, out)
	}
	downDone = true
	downTook := time.Since(downAt)
	for _, r := range reps {
		// SIGTERM alone, exit 0 within the grace and a graceful stop: each
		// node sees its peers all leaving or gone and leaves at once.
		s.graceful(r, s.events.waitStopped(t, r.ID, downAt, 30*time.Second), logs[r.ID], grace)
	}
	if downTook >= grace {
		t.Fatalf("docker compose down took %v, not within stop_grace_period %v", downTook, grace)
	}
	s.nothingLeft()
	t.Logf("docker compose --profile demo down -v: exit 0 in %v. Rows: %d steady and %d held acknowledged and delivered; %d duplicate deliveries in all, at the kill. Test wall time %v",
		downTook.Round(time.Millisecond), len(steady.ackedKeys()), heldRows, c.duplicates(), time.Since(testStart).Round(time.Second))
}

func urls(reps []replica) []string {
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.URL
	}
	return out
}

func (s *stack) mustNamespace(base, ns string) namespaceView {
	s.t.Helper()
	v, err := s.namespace(base, ns)
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// waitPaused polls until every replica sees the held namespace paused.
func (s *stack) waitPaused(reps []replica, paused bool) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range reps {
		for s.mustNamespace(r.URL, heldNamespace).Paused != paused {
			if time.Now().After(deadline) {
				s.t.Fatalf("%s: namespace %s not paused=%v after 30 s", r.Container, heldNamespace, paused)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// heldSpread returns the held rows pending on the replicas, which must add
// up to heldRows once per copy (replicated shards: min(R, replicas) copies
// of each, every replica counting those it holds); with everyHolds, each
// replica must hold some (shard sync gave new replicas their share).
func (s *stack) heldSpread(reps []replica, everyHolds bool) int {
	s.t.Helper()
	var cv clusterView
	if err := s.getJSON(reps[0].URL, "/v1/cluster", &cv); err != nil {
		s.t.Fatal(err)
	}
	copies := max(cv.Replication.Copies, 1)
	total := 0
	var spread []string
	for _, r := range reps {
		v := s.mustNamespace(r.URL, heldNamespace)
		if everyHolds && v.Pending == 0 {
			s.t.Fatalf("%s holds no row of the paused namespace: handoff did not give it its shards' rows", r.Container)
		}
		if v.Claimed != 0 {
			s.t.Fatalf("%s claimed %d rows of the paused namespace", r.Container, v.Claimed)
		}
		total += v.Pending
		spread = append(spread, fmt.Sprintf("%s %d", r.Container, v.Pending))
	}
	if total != copies*heldRows {
		s.t.Fatalf("held rows pending on the replicas: %s; %d in all, want %d (%d copies of %d)", strings.Join(spread, ", "), total, copies*heldRows, copies, heldRows)
	}
	s.t.Logf("held rows pending: %s (%d copies of %d)", strings.Join(spread, ", "), copies, heldRows)
	return total / copies
}

func (s *stack) noneDelivered(c targetCounts, ns string) {
	s.t.Helper()
	if n := c.delivered(ns); n != 0 {
		s.t.Fatalf("%d rows of the paused namespace %s were delivered", n, ns)
	}
}

// pickVictim is the replica holding the most held rows.
func (s *stack) pickVictim(reps []replica) replica {
	s.t.Helper()
	best, most := reps[0], -1
	for _, r := range reps {
		if n := s.mustNamespace(r.URL, heldNamespace).Pending; n > most {
			best, most = r, n
		}
	}
	return best
}

// identity is what a replica must keep across a kill: its slot dir (from
// the "data dir opened" log records, one per start of the node; starts
// counts them) and its held rows.
type identity struct {
	slot   string
	starts int
	held   int
}

func (s *stack) identity(r replica) identity {
	s.t.Helper()
	out := mustDocker(s.t, time.Minute, nil, "logs", r.ID)
	recs := logRecords(out, "data dir opened")
	if len(recs) == 0 {
		s.t.Fatalf("%s logged no \"data dir opened\" record", r.Container)
	}
	slot, _ := recs[len(recs)-1]["data_dir"].(string)
	for _, rec := range recs {
		if d, _ := rec["data_dir"].(string); d != slot {
			s.t.Fatalf("%s used data dirs %v: a replica must keep its slot", r.Container, recs)
		}
	}
	if !regexp.MustCompile(`^/data/slot-\d+$`).MatchString(slot) {
		s.t.Fatalf("%s: data dir %q is no slot dir", r.Container, slot)
	}
	return identity{slot: slot, starts: len(recs), held: s.mustNamespace(r.URL, heldNamespace).Pending}
}

// keysOn returns up to n acknowledged keys of l that node holds (asked
// through base).
func (s *stack) keysOn(l *ledger, base, node string, n int) []string {
	s.t.Helper()
	var out []string
	for _, k := range l.ackedKeys() {
		v, err := s.row(base, k)
		if err != nil {
			s.t.Fatal(err)
		}
		if v.Node == node {
			out = append(out, k)
			if len(out) == n {
				break
			}
		}
	}
	if len(out) == 0 {
		s.t.Fatalf("no held row is on %s", node)
	}
	return out
}

// waitGone polls until every other replica has dropped the killed one from
// its members (its shards moved to them).
func (s *stack) waitGone(victim replica, reps []replica, timeout time.Duration) {
	s.t.Helper()
	start := time.Now()
	for _, r := range reps {
		if r.ID == victim.ID {
			continue
		}
		for {
			var v clusterView
			err := s.getJSON(r.URL, "/v1/cluster", &v)
			gone := err == nil && !slices.ContainsFunc(v.Members, func(m member) bool {
				return m.Name == victim.Node && m.OwnedShards > 0
			})
			if gone {
				break
			}
			if time.Since(start) > timeout {
				s.t.Fatalf("%s still counts the killed %s as an owner after %v (%v)", r.Container, victim.Node, timeout, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	s.t.Logf("the other replicas took over the killed replica's shards %v after the kill", time.Since(start).Round(time.Millisecond))
}

func (s *stack) byNumber(reps []replica, n int) replica {
	s.t.Helper()
	for _, r := range reps {
		if r.Number == n {
			return r
		}
	}
	s.t.Fatalf("no replica number %d among %v", n, reps)
	return replica{}
}

// graceful checks a replica compose stopped: SIGTERM only (no SIGKILL
// after the grace), exit 0 within the grace, and the node logged that it
// drained (in-flight deliveries finished, every row handed off).
func (s *stack) graceful(r replica, rec stopRecord, log *logFollower, grace time.Duration) {
	s.t.Helper()
	text := log.text(30 * time.Second)
	if !slices.Equal(rec.Signals, []string{"15"}) || rec.ExitCode != "0" || rec.Took >= grace {
		s.t.Fatalf("%s: %s; want SIGTERM only and exit code 0 within %v; its log ends:\n%s", r.Container, rec, grace, lastLines(text, 15))
	}
	if len(logRecords(text, "node stopped gracefully")) != 1 {
		s.t.Fatalf("%s stopped without a graceful drain; its log ends:\n%s", r.Container, lastLines(text, 15))
	}
	s.t.Logf("%s (%s) drained and stopped: %s", r.Container, r.Node, rec)
}

// sampleDone checks n random keys of keys are done in the cluster.
func (s *stack) sampleDone(keys []string, base string, n int) {
	s.t.Helper()
	for range n {
		k := keys[rand.IntN(len(keys))]
		v, err := s.row(base, k)
		if err != nil || v.Status != "done" {
			s.t.Fatalf("row %s: %+v, %v; want done", k, v, err)
		}
	}
}

// The scratch test image must stay the real image's twin: same
// entrypoint, command, ports and volume, and user 65532, which is
// distroless's nonroot.
func TestScratchImageMatchesDockerfile(t *testing.T) {
	real := finalStage(t, filepath.Join("..", "..", "Dockerfile"))
	test := finalStage(t, "Dockerfile.scratch")
	for _, in := range []string{"ENTRYPOINT", "CMD", "EXPOSE", "VOLUME"} {
		if real[in] != test[in] || real[in] == "" {
			t.Errorf("%s: Dockerfile has %q, Dockerfile.scratch %q", in, real[in], test[in])
		}
	}
	if real["USER"] != "nonroot:nonroot" || test["USER"] != "65532:65532" {
		t.Errorf("USER: Dockerfile %q, Dockerfile.scratch %q; want nonroot:nonroot and its uid:gid 65532:65532", real["USER"], test["USER"])
	}
	if !strings.Contains(real["COPY"], "--chown=65532:65532") || !strings.Contains(test["COPY"], "--chown=65532:65532") {
		t.Errorf("/data must be owned by 65532: Dockerfile COPY %q, Dockerfile.scratch COPY %q", real["COPY"], test["COPY"])
	}
}

// finalStage returns the instructions of a Dockerfile's last stage (the
// last of each kind; COPY lines joined).
func finalStage(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		in, arg, _ := strings.Cut(line, " ")
		in = strings.ToUpper(in)
		if in == "FROM" {
			out = map[string]string{}
			continue
		}
		if in == "COPY" {
			out[in] += arg + "\n"
			continue
		}
		out[in] = strings.TrimSpace(arg)
	}
	return out
}
