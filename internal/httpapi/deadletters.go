package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/outbox"
)

// Byte budgets of a dead-letter page. A page is bounded by bytes as well
// as rows: with large payloads a row limit alone lets one answer (and the
// heap that builds it) grow with the limit
// (docs/adr/0051-dead-letter-pages-bounded-by-bytes.md).
const (
	// DeadLetterPageBytes is the default byte budget of one dead-letter
	// page (GET /v1/namespaces/{ns}/dead-letters, max_bytes): 4 MiB of
	// JSON rows. A page holds at least one row, so one answer is at most
	// the budget plus one row (a 1 MiB payload is 1.4 MiB of base64).
	DeadLetterPageBytes = 4 << 20
	// MaxDeadLetterPageBytes is the largest max_bytes a caller may ask:
	// 16 MiB.
	MaxDeadLetterPageBytes = 16 << 20
)

// parseDeadLetterQuery reads a page request:
// ?after=&through=&limit=&max_bytes=&include_payload= (through: internal
// calls only). Defaults: 100 rows, DeadLetterPageBytes, with payloads.
func parseDeadLetterQuery(v url.Values) (peer.DeadLetterQuery, error) {
	q := peer.DeadLetterQuery{After: v.Get("after"), Through: v.Get("through"), Limit: 100,
		MaxBytes: DeadLetterPageBytes, WithPayload: true}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxDeadLetterPage {
			return q, httperr.Field("limit", "must be an integer from 1 to %d", maxDeadLetterPage)
		}
		q.Limit = n
	}
	if s := v.Get("max_bytes"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxDeadLetterPageBytes {
			return q, httperr.Field("max_bytes", "must be an integer from 1 to %d", MaxDeadLetterPageBytes)
		}
		q.MaxBytes = n
	}
	if s := v.Get("include_payload"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return q, httperr.Field("include_payload", "must be true or false")
		}
		q.WithPayload = b
	}
	return q, nil
}

// localDeadLetters reads this node's part of a page (q.MaxBytes as
// outbox.RowBytes counts them) as views; more: the part was cut. Only the
// dead letters of shards this node is primary of are its part (the
// backups hold copies of the same rows): the store skips the others by
// key before reading them, so a backup's large payloads cost this read
// nothing.
func (a *API) localDeadLetters(ctx context.Context, ns string, q peer.DeadLetterQuery) ([]api.Row, bool, error) {
	page, err := a.cfg.Store.ListDeadLetterPage(ctx, ns, outbox.DeadLetterQuery{
		After: q.After, Through: q.Through, Limit: q.Limit, MaxBytes: q.MaxBytes,
		WithoutPayload: !q.WithPayload, Keep: a.primaryIn(a.cfg.Ownership())})
	if err != nil {
		return nil, false, err
	}
	views := peer.ViewsOf(page.Rows, a.cfg.Self)
	if !q.WithPayload {
		for i := range views {
			views[i].PayloadSize = page.PayloadBytes[i]
		}
	}
	return views, page.More, nil
}

// deadLetterPart is one node's part of a page: its rows as JSON, in key
// order, and whether it was cut (more rows follow on that node).
type deadLetterPart struct {
	node  string // "" for this node
	addr  string
	rows  []deadLetterJSON
	more  bool
	chose int // rows of this part the page takes (step 2)
}

type deadLetterJSON struct {
	key  string
	json []byte
	// full is the row's JSON size with its payload (step 1's estimate).
	full int
}

// deadLetterParts reads one part from this node (if local) and from each
// of peers, and returns them with the names of the peers that did not
// answer.
func (a *API) deadLetterParts(ctx context.Context, ns string, q peer.DeadLetterQuery, local bool, peers []peerRef) ([]deadLetterPart, []string, error) {
	var parts []deadLetterPart
	if local {
		views, more, err := a.localDeadLetters(ctx, ns, q)
		if err != nil {
			return nil, nil, err
		}
		part := deadLetterPart{more: more}
		for i := range views {
			b, err := views[i].MarshalJSON() // not HTML-escaped, as peers answer
			if err != nil {
				return nil, nil, err
			}
			part.rows = append(part.rows, deadLetterJSON{key: views[i].DispatchKey, json: b, full: fullJSONBytes(len(b), views[i].PayloadSize)})
		}
		parts = append(parts, part)
	}
	var mu sync.Mutex
	call := func(ctx context.Context, m peerRef) error {
		resp, err := a.cfg.Peers.DeadLetters(ctx, m.addr, ns, q)
		if err != nil {
			return err
		}
		part := deadLetterPart{node: m.name, addr: m.addr, more: len(resp.Rows) >= q.Limit} // a node that sends no "more"
		if resp.More != nil {
			part.more = *resp.More
		}
		for _, raw := range resp.Rows {
			var k struct {
				DispatchKey  string `json:"dispatch_key"`
				PayloadBytes int    `json:"payload_bytes"`
			}
			if err := json.Unmarshal(raw, &k); err != nil {
				return fmt.Errorf("dead letter from %s: %w", m.name, err)
			}
			part.rows = append(part.rows, deadLetterJSON{key: k.DispatchKey, json: raw, full: fullJSONBytes(len(raw), k.PayloadBytes)})
		}
		if !slices.IsSortedFunc(part.rows, func(a, b deadLetterJSON) int { return strings.Compare(a.key, b.key) }) {
			return fmt.Errorf("dead letters from %s are not in key order", m.name)
		}
		mu.Lock()
		parts = append(parts, part)
		mu.Unlock()
		return nil
	}
	return parts, a.fanOutTo(ctx, peers, peerCallTimeout, call), nil
}

// fullJSONBytes estimates a row's JSON size with its payload from its size
// without (payloadBytes > 0 when the payload was left out): base64 plus
// the field name, minus the payload_bytes field. A JSON payload's form
// ("payload", compact and not HTML-escaped) is never larger.
func fullJSONBytes(without, payloadBytes int) int {
	if payloadBytes == 0 {
		return without
	}
	return without + base64.StdEncoding.EncodedLen(payloadBytes) + len(`"payload_base64":"",`) - len(`"payload_bytes":,`) - len(strconv.Itoa(payloadBytes))
}

// handleDeadLetters lists a namespace's dead letters across the cluster,
// ordered by dispatch_key; "next" is the cursor for ?after=. A page holds
// at most limit rows and max_bytes of JSON rows (default
// DeadLetterPageBytes; at least one row), and a request holds about that
// much in memory whatever the payload sizes and the number of nodes:
//
//  1. every node sends its next limit rows without payloads (keys and
//     payload sizes, a few hundred bytes a row);
//  2. the page is chosen from them: in key order, up to the first key
//     after which some node may hold rows it did not send, within limit
//     and the budget (each row's size with its payload);
//  3. with include_payload (the default), the nodes holding chosen rows
//     send them again, with payloads, through the page's last key.
//
// include_payload=false answers from step 1 (rows carry payload_bytes).
func (a *API) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	q, err := parseDeadLetterQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	q.Through = ""
	keys := q
	keys.WithPayload, keys.MaxBytes = false, MaxDeadLetterPageBytes
	parts, unreachable, err := a.deadLetterParts(r.Context(), ns, keys, true, a.peerMembers())
	if err != nil {
		writeError(w, err)
		return
	}
	rows, next := chooseDeadLetters(parts, q.Limit, q.MaxBytes, q.WithPayload, false)
	if !q.WithPayload || len(rows) == 0 {
		writeDeadLetterPage(w, rows, next, unreachable)
		return
	}
	// Step 3: the chosen rows again, with their payloads, from the nodes
	// that hold them, through the page's last key.
	full := q
	full.Through = rows[len(rows)-1].key
	var peers []peerRef
	local := false
	for _, p := range parts {
		if p.chose == 0 {
			continue
		}
		if p.node == "" {
			local = true
			continue
		}
		peers = append(peers, peerRef{name: p.node, addr: p.addr})
	}
	size := 0
	for _, row := range rows {
		size += row.full
	}
	full.MaxBytes = min(max(size, 1), MaxDeadLetterPageBytes)
	parts2, unreachable2, err := a.deadLetterParts(r.Context(), ns, full, local, peers)
	if err != nil {
		writeError(w, err)
		return
	}
	unreachable = append(unreachable, unreachable2...)
	slices.Sort(unreachable)
	rows, next2 := chooseDeadLetters(parts2, q.Limit, q.MaxBytes, true, next != "")
	writeDeadLetterPage(w, rows, next2, slices.Compact(unreachable))
}

// chooseDeadLetters merges the nodes' parts of a page: rows in key order
// up to the last key every node has sent all its rows before (the smallest
// last key of a part that was cut), at most limit rows and, past the
// first, maxBytes of JSON (each row's size with its payload when
// withPayload, as the parts carry it or estimate it). It records in each
// part how many of its rows were taken. next is the last row's key when
// rows remain (left out here, cut from a part, or remain already says so),
// else "".
func chooseDeadLetters(parts []deadLetterPart, limit, maxBytes int, withPayload, remain bool) (rows []deadLetterJSON, next string) {
	var cut string
	hasCut := false
	type src struct {
		row  deadLetterJSON
		part int
	}
	var all []src
	for i, p := range parts {
		if p.more && len(p.rows) > 0 {
			if last := p.rows[len(p.rows)-1].key; !hasCut || last < cut {
				cut, hasCut = last, true
			}
		}
		remain = remain || p.more
		for _, r := range p.rows {
			all = append(all, src{r, i})
		}
	}
	slices.SortStableFunc(all, func(a, b src) int { return strings.Compare(a.row.key, b.row.key) })
	size := 0
	for _, s := range all {
		n := len(s.row.json)
		if withPayload {
			n = s.row.full
		}
		if (hasCut && s.row.key > cut) || len(rows) >= limit || (len(rows) > 0 && size+n > maxBytes) {
			remain = true
			break
		}
		size += n + 1
		rows = append(rows, s.row)
		parts[s.part].chose++
	}
	if remain && len(rows) > 0 {
		next = rows[len(rows)-1].key
	}
	return rows, next
}

// writeDeadLetterPage writes {"rows":[…],"next":…,"unreachable_nodes":[…]}
// from rows already in JSON, without building the answer a second time.
func writeDeadLetterPage(w http.ResponseWriter, rows []deadLetterJSON, next string, unreachable []string) {
	if unreachable == nil {
		unreachable = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"rows":[`)
	for i, r := range rows {
		if i > 0 {
			_, _ = io.WriteString(w, ",")
		}
		_, _ = w.Write(r.json)
	}
	tail, _ := json.Marshal(struct {
		Next        string   `json:"next"`
		Unreachable []string `json:"unreachable_nodes"`
	}{next, unreachable})
	_, _ = io.WriteString(w, "],")
	_, _ = w.Write(tail[1:])
	_, _ = io.WriteString(w, "\n")
}
