package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/outbox"
)

// peerLocal answers this node's peers (peer.Local) from the same local
// reads and writes as the /v1 routes, with the same checks of what it is
// given.
type peerLocal struct{ a *API }

var _ peer.Local = peerLocal{}

// Row is this node's copy of the row of key; peer.ErrNotFound when it
// holds none.
func (l peerLocal) Row(ctx context.Context, key string) (api.Row, error) {
	if key == "" || len(key) > MaxKeyBytes {
		return api.Row{}, httperr.Field("dispatch_key", "must be 1-%d bytes", MaxKeyBytes)
	}
	row, err := l.a.cfg.Store.Get(ctx, key)
	if errors.Is(err, outbox.ErrNotFound) {
		return api.Row{}, fmt.Errorf("row %q: %w", key, peer.ErrNotFound)
	}
	if err != nil {
		return api.Row{}, err
	}
	return l.a.lookupView(ctx, row), nil
}

// DeadLetters is this node's part of a dead-letter page of ns; More says
// the part was cut by limit or max_bytes (this node has dead letters
// after the last one sent, not after through when given).
func (l peerLocal) DeadLetters(ctx context.Context, ns string, query url.Values) (peer.DeadLettersResponse, error) {
	q, err := parseDeadLetterQuery(query)
	if err != nil {
		return peer.DeadLettersResponse{}, err
	}
	views, more, err := l.a.localDeadLetters(ctx, ns, q)
	if err != nil {
		return peer.DeadLettersResponse{}, err
	}
	return peer.DeadLettersResponse{Rows: views, More: &more}, nil
}

// Redrive redrives the dead letters of ns (keys, or all) this node is
// primary of, then wakes the dispatcher to claim them.
func (l peerLocal) Redrive(ctx context.Context, ns string, keys []string) (int, error) {
	if err := validateRedriveKeys(keys); err != nil {
		return 0, err
	}
	n, err := l.a.redrivePrimary(ctx, ns, keys)
	if err != nil {
		return 0, err
	}
	l.a.cfg.Dispatcher.Wake()
	return n, nil
}

// Purge purges the dead letters of ns (keys, or all) this node is
// primary of.
func (l peerLocal) Purge(ctx context.Context, ns string, keys []string) (int, error) {
	if err := checkPurgeKeys(keys); err != nil {
		return 0, err
	}
	return l.a.purgePrimary(ctx, ns, keys)
}

// Rows is this node's page of ns's row listing.
func (l peerLocal) Rows(ctx context.Context, ns string, query url.Values) (api.RowPage, error) {
	q, err := rowQuery(ns, query)
	if err != nil {
		return api.RowPage{}, err
	}
	return l.a.localRows(ctx, q)
}

// Cancel cancels req's row if this node holds it; peer.ErrNotFound when
// it does not.
func (l peerLocal) Cancel(ctx context.Context, req peer.CancelRequest) (api.CancelResult, error) {
	if err := checkCancel(req); err != nil {
		return api.CancelResult{}, err
	}
	res, found, err := l.a.cancelLocal(ctx, req)
	if err == nil && !found {
		err = fmt.Errorf("row %q: %w", req.DispatchKey, peer.ErrNotFound)
	}
	return res, err
}

// Stats is this node's counts and delivery figures.
func (l peerLocal) Stats(ctx context.Context) (peer.NodeStats, error) {
	s, _, err := l.a.localStats(ctx)
	return s, err
}
