package compose

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// composeSecrets are the secrets of a run. The gossip key is handed in
// as a user's env file would (the init service writes it to the
// node-secrets volume); the cluster secret and the API token are left to
// the init service to generate, as they are for a user who sets nothing
// (docs/operations.md "Running with docker compose"), and the test reads
// the token with the command that guide gives (apiToken). env() is the
// environment of every docker compose command, and APIToken is what the
// test's HTTP client and load generator send.
type composeSecrets struct {
	APIToken  string // the init service's, read by apiToken after the first up
	GossipKey string // FAIRSHARD_GOSSIP_KEY: base64, 32 bytes (AES-256)
}

func newSecrets(t *testing.T) composeSecrets {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return composeSecrets{GossipKey: base64.StdEncoding.EncodeToString(key)}
}

func (s composeSecrets) env() []string {
	return []string{"FAIRSHARD_GOSSIP_KEY=" + s.GossipKey}
}

// apiTokenLine is how `fairshard secrets` writes a generated token.
var apiTokenLine = regexp.MustCompile(`(?m)^[0-9a-f]{64}$`)

// apiToken runs the compose guide's command that prints the API token the
// init service generated into the node-secrets volume, and keeps it for
// the test's calls.
func (s *stack) apiToken() string {
	s.t.Helper()
	out := s.mustCompose(time.Minute, "run", "--rm", "--no-deps", "-T", "secrets", "secrets", "--dir", "/secrets", "--print-api-token")
	tok := apiTokenLine.FindString(out)
	if tok == "" {
		s.t.Fatalf("the compose guide's token command printed no token:\n%s", out)
	}
	s.secrets.APIToken = tok
	return tok
}

// unauthenticated sends method path to base without the token and returns
// the status.
func (s *stack) unauthenticated(method, base, path string) (int, error) {
	req, err := http.NewRequest(method, base+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// stack is one compose project made from the repository's
// docker-compose.yml.
type stack struct {
	t       *testing.T
	root    string // repository root (the compose project directory)
	file    string // docker-compose.yml
	project string // unique per run
	secrets composeSecrets
	env     []string // of every docker compose command
	http    *http.Client
	events  *eventLog
}

func newStack(t *testing.T, root string) *stack {
	t.Helper()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	s := &stack{
		t:       t,
		root:    root,
		file:    filepath.Join(root, "docker-compose.yml"),
		project: fmt.Sprintf("%s%d-%x", projectPrefix, os.Getpid(), suffix),
		secrets: newSecrets(t),
		http:    &http.Client{Timeout: 5 * time.Second},
	}
	// The developer's FAIRSHARD_* and COMPOSE_* variables would change
	// what the file means (a default target, a project, more files): the
	// run sees only the secrets.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FAIRSHARD_") && !strings.HasPrefix(kv, "COMPOSE_") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, s.secrets.env()...)
	return s
}

// compose runs `docker compose -f docker-compose.yml -p PROJECT args...`.
func (s *stack) compose(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append([]string{"compose", "--file", s.file, "--project-directory", s.root, "--project-name", s.project}, args...)
	return docker(ctx, s.env, full...)
}

func (s *stack) mustCompose(timeout time.Duration, args ...string) string {
	s.t.Helper()
	out, err := s.compose(timeout, args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// up runs the README's command: `docker compose up -d --no-build --scale
// node=N node target` and returns how long it took.
func (s *stack) up(n int) time.Duration {
	s.t.Helper()
	start := time.Now()
	s.mustCompose(3*time.Minute, "up", "--detach", "--no-build", "--scale", fmt.Sprintf("node=%d", n), "node", "target")
	took := time.Since(start)
	s.t.Logf("docker compose up -d --no-build --scale node=%d node target: %v", n, took.Round(time.Millisecond))
	return took
}

// stopGracePeriod reads the node service's stop_grace_period from the
// resolved compose file.
func (s *stack) stopGracePeriod() time.Duration {
	s.t.Helper()
	out := s.mustCompose(time.Minute, "config", "--format", "json")
	var cfg struct {
		Services map[string]struct {
			StopGracePeriod string `json:"stop_grace_period"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		s.t.Fatalf("docker compose config --format json: %v", err)
	}
	g, err := time.ParseDuration(cfg.Services["node"].StopGracePeriod)
	if err != nil || g <= 0 {
		s.t.Fatalf("node service: stop_grace_period %q: %v", cfg.Services["node"].StopGracePeriod, err)
	}
	return g
}

// removeStale takes down projects a killed run of this test left behind
// (the caller holds the host lock, so no other run is using them).
func (s *stack) removeStale() {
	s.t.Helper()
	names := map[string]bool{}
	for _, args := range [][]string{
		{"ps", "--all", "--filter", "label=com.docker.compose.project", "--format", `{{.Label "com.docker.compose.project"}}`},
		{"volume", "ls", "--filter", "label=com.docker.compose.project", "--format", `{{.Label "com.docker.compose.project"}}`},
		{"network", "ls", "--filter", "label=com.docker.compose.project", "--format", `{{.Label "com.docker.compose.project"}}`},
	} {
		out := mustDocker(s.t, time.Minute, nil, args...)
		for _, p := range strings.Fields(out) {
			if strings.HasPrefix(p, projectPrefix) {
				names[p] = true
			}
		}
	}
	for p := range names {
		s.t.Logf("removing the leftovers of an earlier run: compose project %s", p)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		_, err := docker(ctx, s.env, "compose", "--file", s.file, "--project-directory", s.root, "--project-name", p,
			"--profile", "demo", "down", "--volumes", "--timeout", "5")
		cancel()
		if err != nil {
			s.t.Logf("leftover project %s: %v", p, err)
		}
	}
}

// nothingLeft checks that no container, network or volume of the project
// remains.
func (s *stack) nothingLeft() {
	s.t.Helper()
	label := "label=com.docker.compose.project=" + s.project
	for _, args := range [][]string{
		{"ps", "--all", "--quiet", "--filter", label},
		{"network", "ls", "--quiet", "--filter", label},
		{"volume", "ls", "--quiet", "--filter", label},
	} {
		if out := strings.TrimSpace(mustDocker(s.t, time.Minute, nil, args...)); out != "" {
			s.t.Errorf("after down, docker %s lists %s", strings.Join(args[:2], " "), strings.Join(strings.Fields(out), " "))
		}
	}
}

// ---- replicas ----

// replica is one container of the node service.
type replica struct {
	ID        string // container id
	Container string // container name, e.g. PROJECT-node-3
	Number    int    // compose replica number
	Running   bool
	Health    string // healthy, starting, unhealthy
	URL       string // its API through the published port: http://127.0.0.1:PORT
	Node      string // node name (from /v1/cluster; set by waitCluster)
}

// replicas lists the node service's containers, stopped ones included,
// by replica number.
func (s *stack) replicas() ([]replica, error) {
	out, err := s.compose(time.Minute, "ps", "--all", "--quiet", "node")
	if err != nil {
		return nil, err
	}
	return inspectReplicas(strings.Fields(out))
}

func inspectReplicas(ids []string) ([]replica, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := docker(ctx, nil, append([]string{"inspect"}, ids...)...)
	if err != nil {
		return nil, err
	}
	var raw []struct {
		ID    string `json:"Id"`
		Name  string
		State struct {
			Running bool
			Health  *struct{ Status string }
		}
		Config          struct{ Labels map[string]string }
		NetworkSettings struct {
			Ports map[string][]struct{ HostIP, HostPort string }
		}
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		return nil, fmt.Errorf("docker inspect: %w", err)
	}
	var reps []replica
	for _, c := range raw {
		r := replica{ID: c.ID, Container: strings.TrimPrefix(c.Name, "/"), Running: c.State.Running}
		r.Number, _ = strconv.Atoi(c.Config.Labels["com.docker.compose.container-number"])
		if c.State.Health != nil {
			r.Health = c.State.Health.Status
		}
		for _, b := range c.NetworkSettings.Ports["8080/tcp"] {
			if b.HostPort != "" {
				r.URL = "http://127.0.0.1:" + b.HostPort
				break
			}
		}
		reps = append(reps, r)
	}
	sort.Slice(reps, func(i, j int) bool { return reps[i].Number < reps[j].Number })
	return reps, nil
}

// clusterView is the part of GET /v1/cluster the test reads.
type clusterView struct {
	Node    string   `json:"node"`
	Members []member `json:"members"`
	Handoff struct {
		ShardsPending int `json:"shards_pending"`
	} `json:"handoff"`
	// Replication: every shard's copies (min(R, members)) and this node's
	// sync state.
	Replication struct {
		Copies         int `json:"copies"`
		SyncingShards  int `json:"syncing_shards"`
		HandoverShards int `json:"handover_shards"`
		PendingChanges int `json:"pending_changes"`
	} `json:"replication"`
	Security struct {
		Insecure        bool `json:"insecure"`
		NodeAuth        bool `json:"node_auth"`
		GossipEncrypted bool `json:"gossip_encrypted"`
	} `json:"security"`
}

type member struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	OwnedShards int    `json:"owned_shards"`
}

type shardsView struct {
	Shards []struct {
		Shard uint32 `json:"shard"`
		Owner string `json:"owner"`
	} `json:"shards"`
}

// waitCluster polls until exactly n replicas run, all healthy, and agree:
// each lists the same n active members (their node names) and serves the
// same shard table, in which every member owns shards; with settled, every
// replica has also finished handing off and syncing its copies (and no new
// primary waits on a handover). It returns the replicas with their node
// names.
func (s *stack) waitCluster(n int, settled bool, timeout time.Duration) []replica {
	s.t.Helper()
	start := time.Now()
	var reps []replica
	last := ""
	for {
		var ok bool
		reps, ok, last = s.agreed(n, settled)
		if ok {
			s.t.Logf("%d replicas healthy and agreeing on one shard table%s after %v", n,
				map[bool]string{true: ", handoff finished,", false: ""}[settled], time.Since(start).Round(time.Millisecond))
			return reps
		}
		if time.Since(start) > timeout {
			s.t.Fatalf("after %v: %d replicas not healthy and agreeing: %s", timeout, n, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (s *stack) agreed(n int, settled bool) ([]replica, bool, string) {
	all, err := s.replicas()
	if err != nil {
		return nil, false, err.Error()
	}
	var reps []replica
	for _, r := range all {
		if r.Running {
			reps = append(reps, r)
		}
	}
	if len(reps) != n {
		return nil, false, fmt.Sprintf("%d replicas running (of %d containers)", len(reps), len(all))
	}
	for _, r := range reps {
		if r.Health != "healthy" {
			return nil, false, fmt.Sprintf("%s is %q", r.Container, r.Health)
		}
		if r.URL == "" {
			return nil, false, fmt.Sprintf("%s publishes no port for 8080", r.Container)
		}
	}
	views := make([]clusterView, n)
	names := map[string]bool{}
	for i := range reps {
		if err := s.getJSON(reps[i].URL, "/v1/cluster", &views[i]); err != nil {
			return nil, false, err.Error()
		}
		reps[i].Node = views[i].Node
		names[views[i].Node] = true
	}
	if len(names) != n {
		return nil, false, fmt.Sprintf("node names %v: not %d distinct", names, n)
	}
	var table []string
	for i, r := range reps {
		var active []string
		for _, m := range views[i].Members {
			if m.State == "active" && m.OwnedShards > 0 {
				active = append(active, m.Name)
			}
		}
		if len(active) != n || len(views[i].Members) != n {
			return nil, false, fmt.Sprintf("%s (%s) sees %d members, %d active and owning shards, want %d", r.Container, r.Node, len(views[i].Members), len(active), n)
		}
		for _, a := range active {
			if !names[a] {
				return nil, false, fmt.Sprintf("%s sees member %s, which is no running replica", r.Container, a)
			}
		}
		// Secure defaults: the compose deployment runs with a cluster
		// secret (generated by its init service) and a gossip key.
		if sec := views[i].Security; sec.Insecure || !sec.NodeAuth || !sec.GossipEncrypted {
			s.t.Fatalf("%s runs without its secrets: security %+v", r.Container, sec)
		}
		if settled && views[i].Handoff.ShardsPending != 0 {
			return nil, false, fmt.Sprintf("%s: %d shards still to hand off", r.Container, views[i].Handoff.ShardsPending)
		}
		if rv := views[i].Replication; settled && (rv.SyncingShards != 0 || rv.HandoverShards != 0) {
			return nil, false, fmt.Sprintf("%s: %d shards still syncing, %d waiting on a handover", r.Container, rv.SyncingShards, rv.HandoverShards)
		}
		var sv shardsView
		if err := s.getJSON(r.URL, "/v1/shards", &sv); err != nil {
			return nil, false, err.Error()
		}
		owners := make([]string, len(sv.Shards))
		for j, sh := range sv.Shards {
			owners[j] = sh.Owner
		}
		if i == 0 {
			table = owners
		} else if !slices.Equal(table, owners) {
			return nil, false, fmt.Sprintf("%s and %s serve different shard tables", reps[0].Container, r.Container)
		}
	}
	return reps, true, ""
}

// ---- HTTP API ----

func (s *stack) do(method, base, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.secrets.APIToken)
	if body != nil || (method != http.MethodGet && method != http.MethodHead) {
		req.Header.Set("Content-Type", "application/json") // every write, body or not
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s%s: %w", method, base, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%s %s%s: %w: %.300s", method, base, path, errNotFound, data)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s%s: HTTP %d: %.300s", method, base, path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s%s: %w: %.300s", method, base, path, err, data)
		}
	}
	return nil
}

var errNotFound = errors.New("not found")

func (s *stack) getJSON(base, path string, out any) error {
	return s.do(http.MethodGet, base, path, nil, out)
}

// rowView is the part of GET /v1/rows/{dispatch_key} the test reads.
type rowView struct {
	Status string `json:"status"`
	Node   string `json:"node"`
}

func (s *stack) row(base, key string) (rowView, error) {
	var v rowView
	err := s.getJSON(base, "/v1/rows/"+url.PathEscape(key), &v)
	return v, err
}

// namespaceView is the part of GET /v1/namespaces/{ns} the test reads:
// this node's share.
type namespaceView struct {
	Paused  bool   `json:"paused"`
	Pending int    `json:"pending"`
	Claimed int    `json:"claimed"`
	Ceiling uint32 `json:"ceiling"`
	// MaxInFlight is the namespace's quota (cluster-wide).
	MaxInFlight uint32 `json:"max_in_flight"`
}

func (s *stack) namespace(base, ns string) (namespaceView, error) {
	var v namespaceView
	err := s.getJSON(base, "/v1/namespaces/"+ns, &v)
	return v, err
}

// ---- the delivery target ----

// targetCounts is the latest summary the target container logged (every
// 5 s): deliveries (duplicates included) and distinct dispatch_keys.
type targetCounts struct {
	Delivered, Distinct int
	Namespaces          []loadgen.NamespaceReport
	Reports             int // summary lines so far
}

func (c targetCounts) duplicates() int { return c.Delivered - c.Distinct }

func (c targetCounts) delivered(ns string) int {
	for _, r := range c.Namespaces {
		if r.Namespace == ns {
			return r.Delivered
		}
	}
	return 0
}

var targetLine = regexp.MustCompile(`(?m)^delivered=(\d+) distinct=(\d+) namespaces=(.*)$`)

func (s *stack) targetCounts() (targetCounts, error) {
	id, err := s.compose(time.Minute, "ps", "--quiet", "target")
	if err != nil {
		return targetCounts{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := docker(ctx, nil, "logs", strings.TrimSpace(id))
	if err != nil {
		return targetCounts{}, err
	}
	m := targetLine.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return targetCounts{}, nil
	}
	last := m[len(m)-1]
	c := targetCounts{Reports: len(m)}
	c.Delivered, _ = strconv.Atoi(last[1])
	c.Distinct, _ = strconv.Atoi(last[2])
	if err := json.Unmarshal([]byte(last[3]), &c.Namespaces); err != nil {
		return c, fmt.Errorf("target summary %q: %w", last[0], err)
	}
	return c, nil
}

// settle waits until the target has received want distinct dispatch_keys
// and then for its next summary, so that the returned counts include
// anything delivered meanwhile (a late duplicate). More distinct keys than
// want fails at once: a row nobody acknowledged was delivered.
func (s *stack) settle(want int, timeout time.Duration) targetCounts {
	s.t.Helper()
	start := time.Now()
	reached := -1
	var c targetCounts
	for {
		var err error
		c, err = s.targetCounts()
		if err != nil {
			s.t.Fatal(err)
		}
		if c.Distinct > want {
			s.t.Fatalf("the target received %d distinct dispatch_keys, want %d: rows that were never acknowledged were delivered", c.Distinct, want)
		}
		if c.Distinct == want && reached < 0 {
			reached = c.Reports
		}
		if reached >= 0 && c.Reports > reached {
			s.t.Logf("target: %d distinct rows delivered (%d deliveries) %v after the load stopped", c.Distinct, c.Delivered, time.Since(start).Round(time.Second))
			return c
		}
		if time.Since(start) > timeout {
			s.t.Fatalf("after %v the target has %d distinct dispatch_keys of %d acknowledged (%d deliveries): acknowledged rows were not delivered", timeout, c.Distinct, want, c.Delivered)
		}
		time.Sleep(time.Second)
	}
}

// ---- acknowledged rows ----

// ledger records what the load generator was told: acknowledged keys, and
// keys of failed requests (a failed request may still have stored its rows,
// e.g. a replica that stopped before it answered).
type ledger struct {
	mu       sync.Mutex
	acked    map[string]struct{}
	failed   map[string]struct{}
	byStatus map[string]int
}

func newLedger() *ledger {
	return &ledger{acked: map[string]struct{}{}, failed: map[string]struct{}{}, byStatus: map[string]int{}}
}

func (l *ledger) onAppended(key, _, status string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked[key] = struct{}{}
	l.byStatus[status]++
}

func (l *ledger) onFailed(_ string, keys []string, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.failed[k] = struct{}{}
	}
}

func (l *ledger) ackedKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.acked))
	for k := range l.acked {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// expected returns how many distinct rows the cluster must deliver: every
// acknowledged key, plus each key of a failed, never acknowledged request
// that a replica nevertheless stored (asked through base).
func (s *stack) expected(l *ledger, base string) int {
	s.t.Helper()
	l.mu.Lock()
	n := len(l.acked)
	var doubt []string
	for k := range l.failed {
		if _, ok := l.acked[k]; !ok {
			doubt = append(doubt, k)
		}
	}
	l.mu.Unlock()
	stored := 0
	for _, k := range doubt {
		_, err := s.row(base, k)
		switch {
		case err == nil:
			stored++
		case errors.Is(err, errNotFound):
		default:
			s.t.Fatalf("row %s of a failed request: %v", k, err)
		}
	}
	if len(doubt) > 0 {
		s.t.Logf("%d rows of failed requests were never acknowledged; %d of them were stored all the same and must be delivered", len(doubt), stored)
	}
	return n + stored
}

// ---- load ----

// loadRun appends rows to the published ports of the running, healthy
// replicas while the test scales or kills: back-to-back 2 s generator runs,
// each on the replicas running when it starts (as a load balancer would).
type loadRun struct {
	stop     chan struct{}
	done     chan struct{}
	appended atomic.Int64
	errors   atomic.Int64
	gaveUp   atomic.Int64
	runs     int
}

const (
	steadyNamespace = "steady"
	loadRate        = 300 // rows/s
)

func (s *stack) startLoad(l *ledger, phase string) *loadRun {
	s.t.Helper()
	r := &loadRun{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	go func() {
		defer close(r.done)
		for i := 0; ; i++ {
			select {
			case <-r.stop:
				return
			default:
			}
			reps, err := s.replicas()
			var nodes []string
			for _, rep := range reps {
				if err == nil && rep.Running && rep.Health == "healthy" && rep.URL != "" {
					nodes = append(nodes, rep.URL)
				}
			}
			if len(nodes) == 0 {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			g, err := loadgen.NewGenerator(loadgen.Config{
				Nodes: nodes, Token: s.secrets.APIToken, Rate: loadRate, Duration: 2 * time.Second,
				BatchSize: 25, Concurrency: 3, KeyPrefix: fmt.Sprintf("%s-%d-", phase, i), Client: client,
				Namespaces: []loadgen.Namespace{{Name: steadyNamespace, Weight: 1, TaskQueues: 2}},
				OnAppended: l.onAppended, OnFailed: l.onFailed,
			})
			if err != nil {
				panic(err) // a static config: cannot fail
			}
			rep, _ := g.Run(context.Background())
			r.appended.Add(rep.Appended)
			r.errors.Add(rep.Errors)
			r.gaveUp.Add(rep.GaveUp)
			r.runs++
		}
	}()
	return r
}

// waitUnderWay waits until the load has appended rows rows.
func (r *loadRun) waitUnderWay(t *testing.T, rows int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.appended.Load() < rows {
		if time.Now().After(deadline) {
			t.Fatalf("load: %d rows appended in a minute (%d request errors)", r.appended.Load(), r.errors.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finish stops the load after its current 2 s run and reports.
func (r *loadRun) finish(t *testing.T, phase string) {
	t.Helper()
	close(r.stop)
	<-r.done
	t.Logf("load %s: %d rows acknowledged in %d runs, %d failed requests, %d rows given up", phase, r.appended.Load(), r.runs, r.errors.Load(), r.gaveUp.Load())
}
