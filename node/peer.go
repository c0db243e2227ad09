package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// errPeerNotFound is returned by peer calls answered 404.
var errPeerNotFound = errors.New("not found on peer")

// peerClient calls other nodes' internal endpoints (/internal/v1/...),
// authenticated with the cluster secret when one is set.
type peerClient struct {
	http   *http.Client
	secret string
}

func newPeerClient(secret string) *peerClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	return &peerClient{http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, secret: secret}
}

func (c *peerClient) close() { c.http.CloseIdleConnections() }

// call sends in as JSON (nil: no body) and decodes a 2xx answer into out.
func (c *peerClient) call(ctx context.Context, method, apiAddr, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	return c.callBody(ctx, method, apiAddr, path, "application/json", body, out)
}

// callBody sends body (nil: none) with the given content type and decodes
// a 2xx JSON answer into out.
func (c *peerClient) callBody(ctx context.Context, method, apiAddr, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+apiAddr+path, rd)
	if err != nil {
		return fmt.Errorf("peer %s %s: %w", method, path, err)
	}
	req.Header.Set("Content-Type", contentType)
	if c.secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.secret)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("peer %s %s%s: %w", method, apiAddr, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("peer %s %s%s: %w", method, apiAddr, path, errPeerNotFound)
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

type internalAppendReq struct {
	Rows []RowView `json:"rows"`
}

type internalAppendResp struct {
	Outcomes []string `json:"outcomes"`
}

// handoffResp is the answer to a transfer batch: outbox.MergeResult
// (created, updated, skipped).
type handoffResp = outbox.MergeResult

type redriveReq struct {
	Keys []string `json:"keys,omitempty"`
}

type redriveResp struct {
	Redriven int `json:"redriven"`
}

type deadLettersResp struct {
	Rows []RowView `json:"rows"`
	Next string    `json:"next,omitempty"`
}
