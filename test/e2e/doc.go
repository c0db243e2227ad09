// Package e2e holds fairshard's end-to-end tests: real `fairshard serve`
// processes on loopback, real HTTP traffic and real faults. The package has
// no exported API; everything lives in its _test.go files.
//
// # What it owns
//
//   - The harness (harness_test.go): TestMain builds the fairshard binary
//     once (under -race: a race-built and a plain one, see Running). A testCluster
//     starts nodes as child processes, each with its own 127.0.0.N address,
//     API and gossip ports, data dir and log file; it waits on /readyz,
//     membership and ownership convergence by polling with deadlines, and
//     kills (SIGKILL), stops (SIGTERM) and restarts nodes with the same
//     name and data dir. Every process it starts is killed in t.Cleanup;
//     on failure the tail of every node's log is printed.
//   - The scenarios, each asserting exact counts: steady state
//     with quotas, fairness under a big backlog, scale out and scale in
//     under load, crash and restart, bad input, and a node with another
//     shard count.
//
// # What it does not own
//
// Load generation and the recording delivery target: both come from
// package loadgen (one copy of load code, shared with `fairshard load`).
// It talks to nodes only through the public HTTP API and /metrics.
//
// # Running
//
// `go test ./test/e2e` (part of `go test -race ./...`, the README's test
// command). `-short` skips the package. The node processes are plain-built
// in the gate; with FAIRSHARD_RACE_NODES=1 under -race (make test-long)
// they are built with -race too (testnode.RaceNodes), and a data race any
// node reports (in its log) fails the scenario; scenarios that assert
// time, throughput or memory bounds, or move 10⁵-10⁶ rows, run nodes from
// a second, plain build even then
// (clusterOpts.PlainBuild): a race-built node's timing and RSS measure the
// detector, and its volume scenarios took most of the package's CI budget
// (200,000 rows interrupted twice: 6.5 minutes; 200 MiB of dead letters:
// 5 minutes; the suite hit its 20-minute timeout). Nodes run with the
// shared-host gossip profile (testnode.GossipProfile) and short intervals
// so the suite fits the CI budget on a 2-core machine.
//
// # Concurrency
//
// Scenarios run one after another: side by side (t.Parallel) they save
// little on two cores (docs/BENCHMARKS.md "The gate"), and beside the
// rest of the gate the extra load makes the shared-host gossip profile
// suspect live nodes, so a scenario with no fault sees repeat deliveries. Inside a scenario the generator, the target and the node
// processes run concurrently and the test polls their observable state.
package e2e
