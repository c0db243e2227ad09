// Package backpressure decides, once per sweep, how many rows of each
// namespace this node may claim, and claims them through the atomic
// outbox.Store claim. It ports the seed's keyed backpressure
// (seed/backpressure.rs); DESIGN.md states the three load-bearing rules:
//
//  1. CLAIMED-only headroom: headroom = per-node ceiling − this node's
//     claimed rows of the namespace. Pending rows never count, or a tenant
//     would wedge against its own backlog.
//  2. The per-node ceiling comes from a quota.Source (PlannerConfig.
//     Ceilings): the seed's proportional ceil(quota × owned/total), or in
//     exact mode the node's unexpired capacity lease, which FairShare
//     (fairshare.go) computes on the namespace's coordinator.
//  3. Claims stay atomic and exactly-once: the planner only shapes the limit
//     and scope of each Store.Claim. A row it does not claim stays pending.
//
// Beside each namespace's ceiling, a sweep may apply a per-target-host
// ceiling (HostSlots, injected through PlannerConfig.Hosts; package
// dispatch measures the hosts): a route's claims are also capped by what
// its target host has slots for, and a host's slots are shared fairly
// across the namespaces that want it (see Sweep).
//
// What it does not own: delivery and settling (package dispatch), the
// storage (outbox.Store implementations) and where ceilings come from
// (package quota, over the gossiped cluster config and package lease).
//
// Concurrency: the Planner is safe for concurrent use, but a
// node runs one sweep at a time; two concurrent sweeps would each see the
// other's claims only after they commit and could together exceed a
// ceiling by one sweep's worth.
package backpressure
