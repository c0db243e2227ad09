// Package chaos is fairshard's fault-injection soak, in the spirit of
// Jepsen: real `fairshard serve` processes under a steady multi-tenant
// load, a seeded schedule of faults (nemeses), and checkers that judge
// everything the run recorded. Every change must survive it. The package
// has no exported API; everything lives in its _test.go files.
//
// # The lab
//
// Each node runs in its own Linux network namespace (fsc-<pid>-n<i>,
// address 198.18.0.(10+i) for the first 200, API on :8080, gossip on :7946), joined by a veth
// pair to a bridge in a hub namespace (198.18.0.1). The test process owns
// no address in the root namespace: it creates the delivery target's
// listener and the load's connections on a thread switched into the hub
// namespace (setns), so every packet of the run stays inside namespaces it
// made. Network faults are nftables rules inside the node namespaces: a
// partition drops packets to and from the other side's addresses; packet
// loss drops `numgen random mod 100 < p` of the packets arriving from other
// nodes (the hub, i.e. the target and the load, is never behind a faulty
// link). Rules live in the namespace, so they survive a node's restart.
// A run deletes its namespaces at the end, and the namespaces of runs
// whose process is gone at the start.
//
// # Nemeses
//
// Two lanes run concurrently, each one step after another, drawn from a
// printed seed (makePlan): the process lane kills (SIGKILL, then a restart
// with the same name and data dir), restarts gracefully (SIGTERM), pauses
// (SIGSTOP/SIGCONT), adds a node (join) or removes one (SIGTERM, gone for
// good; a leave whose drain exits non-zero is brought back with its data
// dir and stopped again, as README "Operations" tells an operator); the
// network lane isolates one node, splits the nodes in two
// halves, or drops 5–15 % of the packets between nodes. A graceful stop
// is a leave: the node hands off every row it holds before it exits, past
// --shutdown-grace if need be, so the harness waits while the leave makes
// progress (the node's replication.leave.shards_left falls within a
// minute; five minutes in all), then sends a second SIGTERM, as an
// operator would, and SIGKILL 15 s later. Joins and leaves
// never overlap a partition. One initial node, the witness, is never
// killed, restarted or removed, so the leak check always has a process
// that lived through everything. kill-wipe (the killed node's data dir
// deleted before the restart) is on since replicated shards: with R = 2 the
// other copy survives; -chaos.wipe=false or CHAOS_WIPE=0 turns it off. It
// strikes only a fully replicated cluster (no node down or paused, nothing
// under-replicated or syncing; else, after 60 s, it is a plain kill): R = 2
// does not survive a second lost disk in a replica set before shard sync
// made a new copy, and README says so. After the drain every shard's
// replicas must agree (replicas-agree). A partition's duplicates (both
// sides deliver what they hold) are explained by the cut, as README
// "Replicated shards" allows.
//
// # Load
//
// Four namespaces with quotas 2, 8, 32 and 256 append at bursty rates
// through random nodes (down and paused ones included, as a producer with
// a static node list would), retrying every failed batch on another node
// until it is acknowledged. It is a paced loadgen.Generator (load_test.go:
// its config, and its Ledger read as the checkers' rows); the appends go
// through package client.
//
// # Checkers
//
// After the last fault heals, the load stops and the cluster drains (the
// harness waits while acknowledged rows keep arriving: until none came for
// a minute, or 20 minutes in all), the checkers read the target's record of every request (sender by source
// address, start, end, answered or abandoned), the load's ledger, the
// fault timeline and the monitor's polls of /v1/cluster (checker_test.go):
//
//   - every acknowledged row is delivered, every row sent is acknowledged,
//     nothing is delivered that was never appended;
//   - every repeat delivery has a cause the README allows (a kill or pause
//     of the node that made the previous delivery, before it could commit
//     done; an append that failed and was retried or answered "accepted"),
//     a kill explains at most the rows its node could have claimed, and no
//     row appended once is in flight twice at the same time;
//   - a namespace's concurrent deliveries stay under the documented bound
//     (q + N − 1 while every node agrees on one view, twice that during
//     faults and ownership changes; a parameter, for exact quotas)
//     and never above q from one node;
//   - after the last fault heals, every node agrees on one shard table
//     within the failure-detection bound;
//   - while every node agrees on one view, and after the last fault
//     heals, a namespace with acknowledged rows waiting gets a delivery at
//     least every 20 s (namespace-progress: a new lease coordinator's
//     learning period and a new primary's handover wait, 10 s each);
//   - processes that lived through the run hold no more goroutines than
//     their open connections explain, no more non-socket fds and no
//     CLOSE_WAIT socket than before the faults (both read on an idle
//     cluster: /metrics go_goroutines, /proc/<pid>/fd, /proc/<pid>/net/tcp);
//   - no node process exits on its own, every start becomes ready, every
//     graceful stop's leave ends without a second SIGTERM unless a network
//     fault overlapped it (leave-progress), and `fairshard check` passes
//     on every data dir after the run.
//
// Figures, reported and not asserted, include per namespace the longest
// stall while calm and the longest any row waited for its first delivery,
// the drain's length, and the longest stretch in which the nodes reported
// under-replicated shards (with R = 2, one lost disk from losing rows).
//
// A failing run prints the seed and the command that replays it, the fault
// timeline, the first violated invariant with the rows involved (their
// appends and deliveries), the other violations and the tail of every
// node's log, and keeps its work dir. Undelivered rows are looked up
// before any node stops: where the nodes say they are, and each up node's
// GET /v1/namespaces/{ns} of their namespaces (where the capacity is).
//
// # Running
//
// `go test ./test/chaos` runs the short run (2 minutes of faults, about
// 3 minutes in all) as part of `make test`; it needs root, ip(8) and
// nft(8) (.ci/run installs nftables) and skips with a message elsewhere,
// except under CI where it fails. The long run:
//
//	CHAOS_DURATION=30m go test ./test/chaos -run TestChaos -count=1 -v -timeout 45m
//
// -chaos.seed (CHAOS_SEED) replays a schedule: the same faults on the same
// nodes in the same order per lane. Wall-clock timing, and so how the two
// lanes interleave and which rows a fault hits, differ between runs of
// real processes.
package chaos
