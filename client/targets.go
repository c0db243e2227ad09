package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Target is where a route's (namespace, task_queue) rows are delivered.
// SigningSecrets and Headers are sent to the API and never come back:
// the target SetTarget returns has SigningSecretFingerprints and
// HeaderNames instead. String redacts them too.
type Target struct {
	// URL is an absolute http(s) URL of at most 900 bytes; "{namespace}"
	// and "{task_queue}" in it are replaced by the row's.
	URL string
	// Timeout bounds one delivery attempt (whole milliseconds, at most
	// 10 min); 0 means the node's --delivery-timeout.
	Timeout time.Duration
	// SigningSecrets sign every delivery per Standard Webhooks (headers
	// webhook-id = the dispatch_key, webhook-timestamp,
	// webhook-signature): each "whsec_" + base64 of a 24–64 byte key (see
	// package webhook's NewSecret), at most 3, newest first during a
	// rotation. None: deliveries are unsigned.
	SigningSecrets []string
	// Headers are static request headers sent with every delivery (e.g.
	// "Authorization"), at most 16; hop-by-hop, framing and the node's own
	// headers are refused (400 naming headers.<Name>). The URL, secrets
	// and headers together must fit 1,024 bytes as stored.
	Headers map[string]string

	// SigningSecretFingerprints identify the stored secrets (first 4 bytes
	// of SHA-256 of each key, hex), in order; set on answers only.
	SigningSecretFingerprints []string
	// HeaderNames are the stored static headers' names, sorted; set on
	// answers only.
	HeaderNames []string
}

// String shows the target without credentials.
func (t Target) String() string {
	return fmt.Sprintf("{URL:%s Timeout:%v SigningSecrets:%d Headers:%d SigningSecretFingerprints:%v HeaderNames:%v}",
		t.URL, t.Timeout, len(t.SigningSecrets), len(t.Headers), t.SigningSecretFingerprints, t.HeaderNames)
}

// GoString is String (%#v redacts too).
func (t Target) GoString() string { return t.String() }

type wireTarget struct {
	URL                       string            `json:"url"`
	TimeoutMS                 int64             `json:"timeout_ms,omitempty"`
	SigningSecrets            []string          `json:"signing_secrets,omitempty"`
	Headers                   map[string]string `json:"headers,omitempty"`
	SigningSecretFingerprints []string          `json:"signing_secret_fingerprints,omitempty"`
	HeaderNames               []string          `json:"header_names,omitempty"`
}

// MarshalJSON encodes the target as the API takes it (url, timeout_ms,
// signing_secrets, headers).
func (t Target) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireTarget{URL: t.URL, TimeoutMS: t.Timeout.Milliseconds(), SigningSecrets: t.SigningSecrets, Headers: t.Headers})
}

// UnmarshalJSON decodes the API's answer.
func (t *Target) UnmarshalJSON(b []byte) error {
	var w wireTarget
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*t = Target{URL: w.URL, Timeout: time.Duration(w.TimeoutMS) * time.Millisecond,
		SigningSecrets: w.SigningSecrets, Headers: w.Headers,
		SigningSecretFingerprints: w.SigningSecretFingerprints, HeaderNames: w.HeaderNames}
	return nil
}

func targetPath(namespace, taskQueue string) string {
	return "/v1/namespaces/" + url.PathEscape(namespace) + "/task-queues/" + url.PathEscape(taskQueue) + "/target"
}

// SetTarget sets the delivery target of the route (namespace, task_queue),
// replacing any previous one, and returns it as stored. Rows of a route
// without a target go to the nodes' --default-target, or wait.
func (c *Client) SetTarget(ctx context.Context, namespace, taskQueue string, t Target) (*Target, error) {
	body, err := marshal(t)
	if err != nil {
		return nil, err
	}
	var out Target
	if err := c.do(ctx, call{method: http.MethodPut, path: targetPath(namespace, taskQueue), body: body, retry: idempotent, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteTarget removes the route's target (deleting an absent one is not
// an error).
func (c *Client) DeleteTarget(ctx context.Context, namespace, taskQueue string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: targetPath(namespace, taskQueue), retry: idempotent})
}

func holdPath(workflowID string) string {
	return "/v1/workflows/" + url.PathEscape(workflowID) + "/hold"
}

// Hold holds a workflow: none of its rows is claimed until Release (rows
// in flight finish). workflow_id is 1–123 bytes. Holding twice is fine.
func (c *Client) Hold(ctx context.Context, workflowID string) error {
	return c.do(ctx, call{method: http.MethodPut, path: holdPath(workflowID), retry: idempotent})
}

// Release lets a held workflow's rows flow again. Releasing a workflow that
// is not held is fine.
func (c *Client) Release(ctx context.Context, workflowID string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: holdPath(workflowID), retry: idempotent})
}
