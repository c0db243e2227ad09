// Package settings holds a node's runtime config: what operators change
// while the cluster runs (namespace quotas, pauses and retry overrides,
// delivery targets, workflow holds), kept in the gossiped config (package
// kv) under a fixed key layout, with the caches the dispatcher's hot paths
// need, and persisted in the node's store (Persister, Load). Boot
// configuration (flags) lives in package node; validation of what the API
// accepts lives in package httpapi. Settings is safe for concurrent use.
package settings
