package peer

// The node-to-node routes of the public API's fan-outs, as net/http
// ServeMux patterns: NewServer serves exactly these (package httpapi
// mounts it under each), and each Client method calls one of them
// (routes_test.go holds the two sides together). They sit under /internal/, where package
// nodeauth's middleware signs and verifies every call. Replication's own
// routes (forwarded appends, copies, shard sync) are package replication's.
const (
	// RouteRow answers this node's copy of one row (api.Row; 404 when it
	// holds none): Client.GetRow.
	RouteRow = "GET " + PathRows + "{key...}"
	// RouteDeadLetters answers one node's part of a dead-letter page
	// (DeadLetterQuery in, DeadLettersResponse out): Client.DeadLetters.
	RouteDeadLetters = "GET /internal/v1/namespaces/{ns}/dead-letters"
	// RouteRedrive redrives the dead letters this node is primary of
	// (DeadLetterKeys in, RedriveResponse out): Client.Redrive.
	RouteRedrive = "POST /internal/v1/namespaces/{ns}/dead-letters/redrive"
	// RoutePurge purges the dead letters this node is primary of
	// (DeadLetterKeys in, PurgeResponse out): Client.Purge.
	RoutePurge = "POST /internal/v1/namespaces/{ns}/dead-letters/purge"
	// RouteRows answers one node's page of a row listing (the public
	// listing's query string in, api.RowPage out): Client.Rows.
	RouteRows = "GET /internal/v1/namespaces/{ns}/rows"
	// RouteCancel cancels a row this node holds (CancelRequest in,
	// api.CancelResult out; 404 when it holds none): Client.Cancel.
	RouteCancel = "POST " + PathCancel
	// RouteStats answers this node's counts and delivery figures per
	// namespace (NodeStats): Client.Stats.
	RouteStats = "GET " + PathStats
	// RouteLease is the coordinator's batched lease call: Client.Lease.
	RouteLease = "POST " + PathLeases
	// RouteLeaseHandoff keeps a coordinator's records at its successor:
	// Client.LeaseHandoff.
	RouteLeaseHandoff = "POST " + PathLeaseHandoff
	// RouteLeaseStatus answers this node's coordinator state of a
	// namespace (404 when it coordinates none): Client.LeaseStatus.
	RouteLeaseStatus = "GET " + PathLeases + "/{ns}"
)

// Routes lists every pattern above, for a server that registers them all
// and for the test holding client and server together.
func Routes() []string {
	return []string{RouteRow, RouteDeadLetters, RouteRedrive, RoutePurge, RouteRows, RouteCancel,
		RouteStats, RouteLease, RouteLeaseHandoff, RouteLeaseStatus}
}
