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
//   - The scenarios of issue 7, each asserting exact counts: steady state
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
// command). `-short` skips the package. Under -race the node binary is
// built with -race too, and a data race any node reports (in its log) fails
// the scenario; scenarios that assert time, throughput or memory bounds
// run nodes from a second, plain build (clusterOpts.PlainBuild): a
// race-built node's timing and RSS measure the detector (4-8× slower
// sweeps and commits, the detector's shadow memory), and its long drains
// took minutes of the suite's CI budget. Nodes run with the fast gossip profile and short intervals
// so the suite fits the CI budget on a 2-core machine.
//
// # Concurrency
//
// Scenarios run one after another (the machine has two cores); inside a
// scenario the generator, the target and the node processes run
// concurrently and the test polls their observable state.
package e2e
