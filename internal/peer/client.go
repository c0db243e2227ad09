package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/nodeauth"
)

// ErrNotFound is returned (wrapped) by calls the peer answered 404.
var ErrNotFound = errors.New("not found on peer")

// PathRows is the prefix of a row lookup on one node (+ the escaped
// dispatch_key; RouteRow).
const PathRows = "/internal/v1/rows/"

// PathDeadLetters is a namespace's dead-letter page on one node (ns
// escaped).
func PathDeadLetters(ns string) string { return "/internal/v1/namespaces/" + ns + "/dead-letters" }

// PathRedrive is a namespace's redrive route.
func PathRedrive(ns string) string { return PathDeadLetters(ns) + "/redrive" }

// Client calls other nodes' internal endpoints (/internal/v1/...), every
// call signed and every answer verified by package nodeauth when the node
// has a cluster secret. Every call is bounded by its context and by 30 s
// overall. Safe for concurrent use.
type Client struct {
	http   *http.Client
	signed bool
}

// NewClient returns a Client whose calls go through auth's transport (nil:
// unsigned, the insecure mode), keeping up to 16 idle connections per
// peer.
func NewClient(auth *nodeauth.Auth) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	return &Client{http: auth.Client(tr, 30*time.Second), signed: auth != nil}
}

// Probe checks that the peer at apiAddr answers: with a cluster secret, a
// signed challenge it must answer signed (nodeauth.PathChallenge: the
// address proves it is a member); without, GET /healthz. nil when it
// answered as expected.
func (c *Client) Probe(ctx context.Context, apiAddr string) error {
	path, want := "/healthz", http.StatusOK
	if c.signed {
		path, want = nodeauth.PathChallenge, http.StatusNoContent
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+apiAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", apiAddr, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("probe %s%s: HTTP %d, want %d", apiAddr, path, resp.StatusCode, want)
	}
	return nil
}

// CloseIdle closes the client's idle connections (at stop).
func (c *Client) CloseIdle() { c.http.CloseIdleConnections() }

// Call sends in as JSON (nil: no body) to apiAddr's path and decodes a 2xx
// answer into out (nil: discarded). Errors name the peer and path; a 404
// wraps ErrNotFound; another non-2xx carries the status and the start of
// the body.
func (c *Client) Call(ctx context.Context, method, apiAddr, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	return c.CallBody(ctx, method, apiAddr, path, "application/json", body, out)
}

// CallBody is Call with a body already encoded (nil: none) and its
// content type.
func (c *Client) CallBody(ctx context.Context, method, apiAddr, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+apiAddr+path, rd)
	if err != nil {
		return fmt.Errorf("peer %s %s: %w", method, path, err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("peer %s %s%s: %w", method, apiAddr, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("peer %s %s%s: %w", method, apiAddr, path, ErrNotFound)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("peer %s %s%s: HTTP %d: %.300s", method, apiAddr, path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("peer %s %s%s: decode answer: %w", method, apiAddr, path, err)
		}
	}
	return nil
}

// GetRow returns the row of key held by the peer at apiAddr (its answer as
// is: the row and the peer's name); an error wrapping ErrNotFound when it
// holds none.
func (c *Client) GetRow(ctx context.Context, apiAddr, key string) (api.Row, error) {
	var v api.Row
	err := c.Call(ctx, http.MethodGet, apiAddr, PathRows+url.PathEscape(key), nil, &v)
	return v, err
}

// DeadLetters returns the peer's part of a dead-letter page of ns (q: the
// part's bounds, with or without payloads) with its rows as the peer
// encoded them (peer.api.Row JSON), so the asking node can pass them on
// without decoding and encoding the payloads again. The answer is read
// whole: its size is about q.MaxBytes (plus one row), not the peer's
// dead letters.
func (c *Client) DeadLetters(ctx context.Context, apiAddr, ns string, q DeadLetterQuery) (DeadLetterPart, error) {
	var resp DeadLetterPart
	err := c.Call(ctx, http.MethodGet, apiAddr, PathDeadLetters(ns)+"?"+q.Values().Encode(), nil, &resp)
	return resp, err
}

// Redrive redrives the peer's dead letters of ns (all, or req.Keys) and
// returns how many it redrove.
func (c *Client) Redrive(ctx context.Context, apiAddr, ns string, req DeadLetterKeys) (int, error) {
	var resp RedriveResponse
	err := c.Call(ctx, http.MethodPost, apiAddr, PathRedrive(ns), req, &resp)
	return resp.Redriven, err
}

// DeadLetterKeys is the body of a redrive or a purge (public and
// node-to-node): the dispatch_keys, or none for every dead letter of the
// namespace.
type DeadLetterKeys struct {
	Keys []string `json:"keys,omitempty"`
}

// RedriveResponse counts the rows a node redrove.
type RedriveResponse struct {
	Redriven int `json:"redriven"`
}

// DeadLetterQuery is one node's part of a dead-letter page as the internal
// route takes it (?after=&through=&limit=&max_bytes=&include_payload=):
// rows after After and not after Through (when set), at most Limit rows
// and MaxBytes bytes (outbox.RowBytes; at least one row), with payloads
// when WithPayload, else with payload_bytes.
type DeadLetterQuery struct {
	After, Through  string
	Limit, MaxBytes int
	WithPayload     bool
}

// Values is q as the route's query parameters.
func (q DeadLetterQuery) Values() url.Values {
	v := url.Values{"after": {q.After}, "limit": {strconv.Itoa(q.Limit)},
		"max_bytes": {strconv.Itoa(q.MaxBytes)}, "include_payload": {strconv.FormatBool(q.WithPayload)}}
	if q.Through != "" {
		v.Set("through", q.Through)
	}
	return v
}

// DeadLettersResponse is one node's part of a dead-letter page, as the
// internal route answers it: rows in dispatch_key order. More (absent from
// nodes of earlier versions) says the node has dead letters after the last
// row sent (and not after the query's Through).
type DeadLettersResponse struct {
	Rows []api.Row `json:"rows"`
	More *bool     `json:"more,omitempty"`
}

// DeadLetterPart is DeadLettersResponse with its rows left encoded.
type DeadLetterPart struct {
	Rows []json.RawMessage `json:"rows"`
	More *bool             `json:"more,omitempty"`
}
