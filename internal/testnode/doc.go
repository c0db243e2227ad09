// Package testnode runs fairshard nodes for tests, in two lanes that share
// one set of timings:
//
//   - processes: Build compiles the node binary (once per test binary, in
//     its TestMain or setup) and Launch starts it as a child process with
//     the child environment, its output appended to a log file; a Process
//     is signalled, killed, waited for (/readyz, exit) and its log tail read.
//   - in process: Config is a node.Config for a node on its own loopback
//     address and Start runs node.New (or another constructor such as
//     node.NewWithStore) on it until the test's cleanup.
//
// ServeFlags and Config carry the test profile: the shared-host gossip
// profile and short loops. The package is test support: test files of any
// package import it, production code does not.
package testnode
