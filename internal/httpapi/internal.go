package httpapi

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Bounds of rows received from other nodes (forwarded appends, handoff
// batches), checked as strictly as public input: a batch with one bad row
// is refused whole, 4xx naming the row and field, and nothing of it is
// stored.
const (
	// MaxRemoteAttempt bounds a copy's attempt (a row is dead-lettered
	// long before: --max-attempts, at most 1000 per namespace override).
	MaxRemoteAttempt = 1_000_000
	// MaxLastErrorBytes bounds a copy's last_error (the dispatcher keeps
	// 512 bytes by default).
	MaxLastErrorBytes = 4096
	// MaxClockSkew is how far in the future a copy's created_at,
	// claimed_at and finished_at may be (clocks of two nodes differ).
	MaxClockSkew = time.Hour
	// MaxRemoteRows bounds the rows of one forwarded append or handoff
	// batch (senders cut batches at --handoff-batch, ≤ 500 by default, and
	// at MaxBatchRows for appends).
	MaxRemoteRows = 100_000
	// MaxForwardBodyBytes is the body limit of a forwarded append: a
	// public append's limit (MaxRequestBytes) as base64 JSON, plus fields.
	MaxForwardBodyBytes = 2 * MaxRequestBytes
)

// minRowTime is the earliest instant a copy may carry (older ones are
// forged or corrupt).
var minRowTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// checkRemoteRows is replication's RowCheck: validateRemoteRows, answering
// a refused batch with the API's error (4xx naming rows[i].field).
func (a *API) checkRemoteRows(w http.ResponseWriter, rows []outbox.Row, forwarded bool) bool {
	if err := validateRemoteRows(rows, a.cfg.ShardCount, time.Now().UTC(), forwarded); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// validateRemoteRows checks every row a peer sent; forwarded is true for
// a forwarded append (the store makes them new pending rows, so status and
// version are not read), false for a handoff batch (merged by version:
// each copy must carry a version, and a terminal one a version past the
// first, since every terminal transition raises it).
func validateRemoteRows(rows []outbox.Row, shardCount uint32, now time.Time, forwarded bool) error {
	if len(rows) > MaxRemoteRows {
		return httperr.TooLarge("rows", "%d rows exceed the limit of %d per call", len(rows), MaxRemoteRows)
	}
	for i := range rows {
		if err := validateRemoteRow(&rows[i], i, shardCount, now, forwarded); err != nil {
			return err
		}
	}
	return nil
}

func validateRemoteRow(r *outbox.Row, i int, shardCount uint32, now time.Time, forwarded bool) error {
	f := func(name string) string { return fmt.Sprintf("rows[%d].%s", i, name) }
	if r.DispatchKey == "" {
		return httperr.Field(f("dispatch_key"), "is empty")
	}
	if err := checkText(f("dispatch_key"), r.DispatchKey, MaxKeyBytes); err != nil {
		return err
	}
	if err := checkText(f("workflow_id"), r.WorkflowID, MaxWorkflowIDBytes); err != nil {
		return err
	}
	if !ValidName(r.Namespace) {
		return httperr.Field(f("namespace"), "must be 1-64 letters, digits, '-', '_' or '.'")
	}
	if !ValidName(r.TaskQueue) {
		return httperr.Field(f("task_queue"), "must be 1-64 letters, digits, '-', '_' or '.'")
	}
	if err := checkText(f("activity_type"), r.ActivityType, MaxLabelBytes); err != nil {
		return err
	}
	if len(r.Payload) > MaxPayloadBytes {
		return httperr.TooLarge(f("payload"), "is %d bytes, the limit is %d", len(r.Payload), MaxPayloadBytes)
	}
	if r.ContentType != "" {
		if len(r.ContentType) > maxContentLength {
			return httperr.Field(f("content_type"), "is longer than %d bytes", maxContentLength)
		}
		if _, _, err := mime.ParseMediaType(r.ContentType); err != nil {
			return httperr.Field(f("content_type"), "is not a media type: %v", err)
		}
	}
	if r.Attempt > MaxRemoteAttempt {
		return httperr.Field(f("attempt"), "%d exceeds %d", r.Attempt, MaxRemoteAttempt)
	}
	if len(r.LastError) > MaxLastErrorBytes || !validUTF8(r.LastError) {
		return httperr.Field(f("last_error"), "must be valid UTF-8 of at most %d bytes", MaxLastErrorBytes)
	}
	late := now.Add(MaxClockSkew)
	for _, t := range []struct {
		name    string
		v, upTo time.Time
	}{
		{"created_at", r.CreatedAt, late},
		{"claimed_at", r.ClaimedAt, late},
		{"finished_at", r.FinishedAt, late},
		// A row may be delayed by MaxDelay, or backed off by a retry cap
		// of at most a day.
		{"visible_after", r.VisibleAfter, late.Add(MaxDelay + 24*time.Hour)},
	} {
		if !t.v.IsZero() && (t.v.Before(minRowTime) || t.v.After(t.upTo)) {
			return httperr.Field(f(t.name), "%s is outside [%s, %s]", t.v.Format(time.RFC3339), minRowTime.Format(time.RFC3339), t.upTo.Format(time.RFC3339))
		}
	}
	if forwarded {
		return nil
	}
	if !r.Status.Valid() {
		return httperr.Field(f("status"), "%q is not pending, claimed, done, failed or cancelled", r.Status)
	}
	if r.Version.Seq == 0 {
		return httperr.Field(f("version"), "is missing: a copy sent between nodes carries its version")
	}
	if r.Status.Terminal() && r.Version.Seq <= outbox.FirstVersion.Seq {
		return httperr.Field(f("status"), "%s with version %d/%d: a finished row's version is past the first (every terminal transition raises it)", r.Status, r.Version.Gen, r.Version.Seq)
	}
	if r.Version.Gen > 0 && r.Version.Seq < uint64(r.Version.Gen)+1 {
		return httperr.Field(f("version"), "generation %d with change counter %d: each redrive raises both", r.Version.Gen, r.Version.Seq)
	}
	// A merged copy is filed under its shard (a forwarded append's shard
	// is the store's to compute).
	if want := shards.ShardOf(r.DispatchKey, shardCount); r.Shard != want {
		return httperr.Field(f("shard"), "is %d, but dispatch_key %q is in shard %d of %d", r.Shard, r.DispatchKey, want, shardCount)
	}
	return nil
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// readInternalBody reads a node-to-node body whole (at most limit bytes)
// before the handler admits the request as a write: a client that sends
// slowly holds no slot of the intake gate (so it cannot hold a stop).
func readInternalBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, httperr.TooLarge("body", "exceeds %d bytes", limit)
		}
		return nil, &httperr.Error{Status: http.StatusBadRequest, Code: api.CodeInvalidJSON, Field: "body", Message: "body: " + err.Error()}
	}
	return body, nil
}
