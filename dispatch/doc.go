// Package dispatch is fairshard's outbox dispatcher: the part that does the
// work. It sweeps (claims fairly through the backpressure planner),
// delivers each claimed row to its route's HTTP target, and settles the
// outcome on the outbox store: done, retry with backoff, or failed (dead
// letter). A reaper re-arms claims whose delivery died.
//
// # What it owns
//
//   - the sweep loop: a sweep on every jittered PollInterval tick and, debounced,
//     after Wake (the node calls it on append; settles call it when a sweep
//     was short of headroom). Each sweep claims through a [Planner] with
//     the held workflows excluded and paused or target-less routes filtered
//     out, and hands every row to its own delivery goroutine without
//     waiting: a slow target never stalls other tenants;
//   - HTTP push delivery: a POST of the payload with the headers listed at
//     [HeaderIdempotencyKey] and below (newDeliveryRequest), over one
//     shared transport (newTransport) that never makes a request wait for
//     a connection;
//   - per-target-host concurrency ([HostLimits]): each host (scheme, host
//     and port after template expansion) has an adaptive limit, AIMD
//     between 1 and MaxConnsPerHost, that the planner treats as a ceiling
//     beside the namespace's (backpressure.HostSlots), so a claimed row
//     always has a slot to go out on. The delivery timeout starts when the
//     request has a connection (httptrace GotConn);
//   - the outcome mapping: 2xx → done; 408, 425, 429, 5xx, timeouts and
//     connection errors → retry (exponential backoff with jitter,
//     lengthened, never shortened, by a 429's or 503's Retry-After,
//     capped); any other status (other 4xx, 3xx: redirects are not
//     followed) → failed at once with "HTTP <status>: <body excerpt>" as
//     last_error; a retryable failure of the last allowed attempt →
//     failed. An attempt that went out in full and then timed out or lost
//     its connection may have been delivered: its retry's last_error
//     starts with [OutcomeUnknownPrefix];
//   - leases: claims older than VisibilityTimeout (and, at start, every
//     claim made before this process started) go back to pending;
//   - its metrics (metrics.go), labelled by namespace, and the per-host
//     ones (hosts.go), labelled by the hosts in use.
//
// # What it does not own
//
// How rows are stored and claimed atomically (outbox.Store; boltstore),
// how many rows each namespace may claim (package backpressure), where
// targets, pauses, quotas and held workflows come from (the node, from the
// gossiped cluster config), dead-letter listing and redrive (boltstore and
// the node's HTTP API), pending-row gauges (the node, from the store).
//
// # Delivery guarantee
//
// At-least-once. A row is delivered again after a crash mid-delivery, a
// hard stop, a settle that failed or a response lost in transit; the
// dispatch_key travels as Idempotency-Key so targets deduplicate.
//
// # Lifecycle and concurrency
//
// A [Dispatcher] is safe for concurrent use and runs once:
//
//	d, err := dispatch.New(cfg)
//	go d.Run(ctx)        // blocks; cancelling ctx is the hard stop
//	d.Wake()             // after each append
//	d.Drain(graceCtx)    // graceful stop: no new claims, wait for in-flight
//	cancel()             // then hard-stop what is left; Run returns
//
// Run owns two loop goroutines (sweep, reaper) and one goroutine per row in
// flight (at most MaxInFlight). Two contexts: the claim context ends
// sweeps (Drain or Run's ctx); the delivery context is cancelled only by
// a hard stop. A row abandoned by a hard stop stays claimed and is
// re-armed by the visibility timeout, or at the next start.
package dispatch
