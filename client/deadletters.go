package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"github.com/fairshard/fairshard/api"
)

// MaxDeadLetterPage is the most dead letters one page may hold.
const MaxDeadLetterPage = 1000

// DeadLetterPage is one page of a namespace's dead letters, gathered from
// every node and ordered by dispatch_key; pass its Next as
// DeadLetterQuery.After.
type DeadLetterPage = api.RowPage

// DeadLetterQuery selects a page.
type DeadLetterQuery struct {
	// Limit is the page size, 1–1000 rows. Defaults to 100.
	Limit int
	// After starts the page after this dispatch_key (a page's Next).
	After string
	// MaxBytes is the page's byte budget (JSON rows, payloads in base64),
	// 1–16,777,216; a page holds at least one row whatever its size.
	// 0 leaves the node's default (4 MiB).
	MaxBytes int
	// OmitPayload leaves the payloads out (include_payload=false): each
	// row gives RowInfo.PayloadSize instead, so a page of large rows
	// stays small.
	OmitPayload bool
}

// DeadLetters returns one page of the namespace's dead letters (rows with
// status failed). See DeadLetterPages to walk them all.
func (c *Client) DeadLetters(ctx context.Context, namespace string, q DeadLetterQuery) (*DeadLetterPage, error) {
	v := url.Values{}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.MaxBytes != 0 {
		v.Set("max_bytes", strconv.Itoa(q.MaxBytes))
	}
	if q.OmitPayload {
		v.Set("include_payload", "false")
	}
	path := "/v1/namespaces/" + url.PathEscape(namespace) + "/dead-letters"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out DeadLetterPage
	if err := c.do(ctx, call{method: http.MethodGet, path: path, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeadLetterPages iterates over the namespace's dead letters page by page
// (at most limit rows each, 0 for the default 100, and at most the node's
// default byte budget), following Next until the last page. See
// DeadLetterPagesOf to set the byte budget or leave payloads out. An error is yielded once, with a nil page, and ends the iteration.
// The last page may be empty (when the previous one was exactly full).
// Rows redriven or added while iterating may be missed or seen: a page is
// read when the loop reaches it.
//
//	for page, err := range c.DeadLetterPages(ctx, "acme", 500) {
//		if err != nil { return err }
//		for _, row := range page.Rows { … }
//	}
func (c *Client) DeadLetterPages(ctx context.Context, namespace string, limit int) iter.Seq2[*DeadLetterPage, error] {
	return c.DeadLetterPagesOf(ctx, namespace, DeadLetterQuery{Limit: limit})
}

// DeadLetterPagesOf is DeadLetterPages with every page selected by q (its
// After is where the walk starts; "" for the first dead letter).
func (c *Client) DeadLetterPagesOf(ctx context.Context, namespace string, q DeadLetterQuery) iter.Seq2[*DeadLetterPage, error] {
	return func(yield func(*DeadLetterPage, error) bool) {
		for {
			page, err := c.DeadLetters(ctx, namespace, q)
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(page, nil) || page.Next == "" {
				return
			}
			q.After = page.Next
		}
	}
}

// RedriveResult is the answer to Redrive.
type RedriveResult = api.RedriveResult

// Redrive moves the namespace's dead letters back to pending with attempt
// 1, on every node: those with the given dispatch_keys, or all of them when
// none are given. Keys that are not dead letters of the namespace are
// skipped. As a POST that changes state, it is retried only when no node
// could be connected to.
func (c *Client) Redrive(ctx context.Context, namespace string, dispatchKeys ...string) (*RedriveResult, error) {
	cl := call{method: http.MethodPost, path: "/v1/namespaces/" + url.PathEscape(namespace) + "/dead-letters/redrive", retry: notIdempotent}
	if len(dispatchKeys) > 0 {
		body, err := marshal(map[string][]string{"keys": dispatchKeys})
		if err != nil {
			return nil, err
		}
		cl.body = body
	}
	var out RedriveResult
	cl.out = &out
	if err := c.do(ctx, cl); err != nil {
		return nil, err
	}
	return &out, nil
}
