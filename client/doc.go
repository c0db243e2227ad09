// Package client is the Go client of fairshard's public HTTP API (/v1):
// append rows, read a row back, manage namespaces, targets and holds, page
// through and redrive dead letters, and read the cluster's membership and
// shard table.
//
// It depends only on the standard library and speaks the API described in
// api/openapi.yaml (served by every node at /v1/openapi.yaml); it imports no
// fairshard internals, so a producer that uses it links none of the server.
//
// # Basics
//
//	c, err := client.New(client.Options{Nodes: []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}})
//	if err != nil { … }
//	defer c.Close()
//	res, err := c.Append(ctx, client.Row{DispatchKey: "order-42:email", Namespace: "acme", TaskQueue: "mail",
//		Payload: json.RawMessage(`{"to":"a@example.com"}`)})
//
// Every call takes a context.Context, which bounds the whole call, retries
// and waits included.
//
// # Nodes, failover and retries
//
// Any node of a cluster takes any call (appends are forwarded to the owner of
// each row's shard), so the client spreads calls over Options.Nodes round
// robin. A node that fails with a connection error, a timeout or an HTTP 502,
// 503, 504 or 429 is set aside for a cool-down (it doubles with each consecutive
// failure, from 500 ms up to 30 s, and is lengthened by the node's
// Retry-After), and the call is retried on another node.
//
// Only idempotent calls are retried: every GET, PUT and DELETE, and Append,
// which is idempotent because every row has a dispatch_key and the cluster
// deduplicates by it (a retried row the first attempt had stored answers
// "duplicate"; Append documents it). Redrive (a POST) is retried only when
// the connection was refused, i.e. the request cannot have reached a node.
// Between attempts the client waits an exponential backoff with jitter
// (RetryConfig); a Retry-After header on such an answer may lengthen that
// wait, never shorten it, up to RetryConfig.MaxRetryAfter. Errors other than
// those (400, 401, 404, 413, 500…) are returned at once. Options.Timeout
// bounds each attempt (30 s by default), so a node that hangs is left too.
//
// # Errors
//
// An answer other than 2xx is returned as *Error, which carries the HTTP
// status and the API's code, field and message; test with errors.As, or with
// errors.Is against the sentinels ErrNotFound, ErrInvalidField … (which
// compare codes). When retries run out, the last attempt's error is wrapped,
// so errors.As still finds the *Error of a final 503.
//
// # Concurrency
//
// A Client is safe for concurrent use by many goroutines; build one per
// cluster and share it. Close releases its idle connections.
package client
