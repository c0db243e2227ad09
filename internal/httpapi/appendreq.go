package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/outbox"
)

// Append request limits: 1,000 rows and 10 MiB per request, 1 MiB per
// payload, 512 bytes per dispatch_key, 256 bytes per label.
const (
	MaxBatchRows    = 1000
	MaxRequestBytes = 10 << 20
	MaxPayloadBytes = 1 << 20
	MaxKeyBytes     = 512
	MaxLabelBytes   = 256
	// MaxWorkflowIDBytes keeps "hold/{workflow_id}" within the gossiped
	// config's 128-byte key limit, so every workflow can be held.
	MaxWorkflowIDBytes = 128 - len(settings.PrefixHold)
	MaxDelay           = 30 * 24 * time.Hour
	maxContentLength   = 256
)

// nameRE is the rule for namespace and task_queue: short names of letters,
// digits, '-', '_' and '.'.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidName reports whether s is a valid namespace or task_queue name.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// appendRow is one row of POST /v1/rows as the producer sends it.
type appendRow struct {
	DispatchKey   *string         `json:"dispatch_key"`
	WorkflowID    *string         `json:"workflow_id"`
	Ordinal       *uint64         `json:"ordinal"`
	Namespace     *string         `json:"namespace"`
	TaskQueue     *string         `json:"task_queue"`
	ActivityType  *string         `json:"activity_type"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
	ContentType   *string         `json:"content_type"`
	DelayMS       *int64          `json:"delay_ms"`
}

type appendRequest struct {
	Rows []json.RawMessage `json:"rows"`
}

// decodeAppend reads and validates a whole POST /v1/rows body. It returns
// rows ready for the store (created/visible times relative to now), or an
// *httperr.Error naming the first bad field; on error nothing may be written.
func decodeAppend(w http.ResponseWriter, r *http.Request, now time.Time) ([]outbox.Row, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, httperr.TooLarge("body", "request body exceeds %d bytes", MaxRequestBytes)
		}
		return nil, &httperr.Error{Status: http.StatusBadRequest, Code: api.CodeInvalidJSON, Field: "body", Message: "body: " + err.Error()}
	}
	var req appendRequest
	if err := strictUnmarshal(body, &req); err != nil {
		return nil, jsonError("", "body", err)
	}
	switch {
	case req.Rows == nil:
		return nil, httperr.Field("rows", "is required")
	case len(req.Rows) == 0:
		return nil, httperr.Field("rows", "is empty")
	case len(req.Rows) > MaxBatchRows:
		return nil, httperr.TooLarge("rows", "%d rows exceed the limit of %d per request", len(req.Rows), MaxBatchRows)
	}
	rows := make([]outbox.Row, len(req.Rows))
	for i, raw := range req.Rows {
		var in appendRow
		if err := strictUnmarshal(raw, &in); err != nil {
			row := fmt.Sprintf("rows[%d]", i)
			return nil, jsonError(row+".", row, err)
		}
		row, err := in.toRow(i, now)
		if err != nil {
			return nil, err
		}
		rows[i] = row
	}
	return rows, nil
}

// jsonError turns a decoding error into an invalid_json httperr.Error naming
// the field it is about: prefix+name for a value of the wrong type or an
// unknown field, else whole (the JSON text itself is bad).
func jsonError(prefix, whole string, err error) *httperr.Error {
	field := whole
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field != "":
		field = prefix + te.Field
	case strings.HasPrefix(err.Error(), unknownFieldPrefix):
		if name, uerr := strconv.Unquote(strings.TrimPrefix(err.Error(), unknownFieldPrefix)); uerr == nil {
			field = prefix + name
		}
	}
	return &httperr.Error{Status: http.StatusBadRequest, Code: api.CodeInvalidJSON, Field: field, Message: field + ": " + err.Error()}
}

// unknownFieldPrefix starts encoding/json's DisallowUnknownFields error
// (it has no error type of its own).
const unknownFieldPrefix = "json: unknown field "

// strictUnmarshal decodes exactly one JSON value, rejecting unknown fields
// and trailing data.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

func checkText(field, v string, maxBytes int) error {
	if len(v) > maxBytes {
		return httperr.Field(field, "is %d bytes, the limit is %d", len(v), maxBytes)
	}
	if !utf8.ValidString(v) {
		return httperr.Field(field, "is not valid UTF-8")
	}
	for _, c := range v {
		if c < 0x20 || c == 0x7f {
			return httperr.Field(field, "contains a control character")
		}
	}
	return nil
}

// checkDispatchKey applies the dispatch_key rules. The key reaches the
// target as the Idempotency-Key (and Fairshard-Dispatch-Key) header value,
// and must arrive byte for byte: an HTTP field value cannot carry control
// characters (RFC 9110 §5.5; tab included here: it has no place in a key),
// and its leading and trailing whitespace is not part of the value
// (recipients strip it, §5.5). So a key is refused when it is empty, only
// whitespace, starts or ends with whitespace (Unicode White_Space, which
// includes the ASCII space and tab the header would lose), or holds a
// control character. Anything else valid UTF-8 up to MaxKeyBytes travels
// intact.
func checkDispatchKey(field, key string) error {
	switch {
	case key == "":
		return httperr.Field(field, "is empty")
	case len(key) > MaxKeyBytes:
		return httperr.Field(field, "is %d bytes, the limit is %d", len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return httperr.Field(field, "is not valid UTF-8")
	case strings.TrimSpace(key) == "":
		return httperr.Field(field, "is only whitespace")
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return httperr.Field(field, "has leading or trailing whitespace, which the Idempotency-Key header would not carry to the target")
	}
	for i, c := range key {
		if c < 0x20 || c == 0x7f {
			return httperr.Field(field, "contains the control character U+%04X at byte %d, which an HTTP header value (Idempotency-Key) cannot carry", c, i)
		}
	}
	return nil
}

func (in *appendRow) toRow(i int, now time.Time) (outbox.Row, error) {
	f := func(name string) string { return fmt.Sprintf("rows[%d].%s", i, name) }
	row := outbox.Row{Namespace: outbox.DefaultName, TaskQueue: outbox.DefaultName, CreatedAt: now, VisibleAfter: now, Attempt: 1}
	if in.WorkflowID != nil {
		if *in.WorkflowID == "" {
			return row, httperr.Field(f("workflow_id"), "is empty")
		}
		if err := checkText(f("workflow_id"), *in.WorkflowID, MaxWorkflowIDBytes); err != nil {
			return row, err
		}
		row.WorkflowID = *in.WorkflowID
	}
	if in.Ordinal != nil {
		row.Ordinal = *in.Ordinal
	}
	switch {
	case in.DispatchKey != nil:
		if err := checkDispatchKey(f("dispatch_key"), *in.DispatchKey); err != nil {
			return row, err
		}
		row.DispatchKey = *in.DispatchKey
	case in.WorkflowID != nil && in.Ordinal != nil:
		row.DispatchKey = outbox.DefaultDispatchKey(row.WorkflowID, row.Ordinal)
		if len(row.DispatchKey) > MaxKeyBytes {
			return row, httperr.Field(f("dispatch_key"), "derived key is longer than %d bytes", MaxKeyBytes)
		}
		if first, _ := utf8.DecodeRuneInString(row.WorkflowID); unicode.IsSpace(first) {
			return row, httperr.Field(f("workflow_id"), "starts with whitespace, so the derived dispatch_key (workflow_id:ordinal) would not reach the target intact in the Idempotency-Key header")
		}
	case in.WorkflowID != nil:
		return row, httperr.Field(f("ordinal"), "is required with workflow_id when dispatch_key is absent")
	default:
		return row, httperr.Field(f("dispatch_key"), "is required (or give workflow_id and ordinal)")
	}
	if in.Namespace != nil {
		if !ValidName(*in.Namespace) {
			return row, httperr.Field(f("namespace"), "must be 1-64 letters, digits, '-', '_' or '.'")
		}
		row.Namespace = *in.Namespace
	}
	if in.TaskQueue != nil {
		if !ValidName(*in.TaskQueue) {
			return row, httperr.Field(f("task_queue"), "must be 1-64 letters, digits, '-', '_' or '.'")
		}
		row.TaskQueue = *in.TaskQueue
	}
	if in.ActivityType != nil {
		if err := checkText(f("activity_type"), *in.ActivityType, MaxLabelBytes); err != nil {
			return row, err
		}
		row.ActivityType = *in.ActivityType
	}
	hasJSON := len(in.Payload) > 0 && !bytes.Equal(in.Payload, []byte("null"))
	switch {
	case hasJSON && in.PayloadBase64 != nil:
		return row, httperr.Field(f("payload"), "give either payload or payload_base64, not both")
	case hasJSON:
		row.Payload = append([]byte(nil), in.Payload...)
		row.ContentType = "application/json"
	case in.PayloadBase64 != nil:
		if base64.StdEncoding.DecodedLen(len(*in.PayloadBase64)) > MaxPayloadBytes+3 {
			return row, httperr.TooLarge(f("payload_base64"), "decoded payload exceeds %d bytes", MaxPayloadBytes)
		}
		b, err := base64.StdEncoding.DecodeString(*in.PayloadBase64)
		if err != nil {
			return row, httperr.Field(f("payload_base64"), "is not valid standard base64: %v", err)
		}
		row.Payload = b
		row.ContentType = "application/octet-stream"
	}
	if len(row.Payload) > MaxPayloadBytes {
		field := "payload"
		if in.PayloadBase64 != nil {
			field = "payload_base64"
		}
		return row, httperr.TooLarge(f(field), "is %d bytes (decoded), the limit is %d", len(row.Payload), MaxPayloadBytes)
	}
	if in.ContentType != nil {
		ct := strings.TrimSpace(*in.ContentType)
		if len(ct) > maxContentLength {
			return row, httperr.Field(f("content_type"), "is longer than %d bytes", maxContentLength)
		}
		if _, _, err := mime.ParseMediaType(ct); err != nil {
			return row, httperr.Field(f("content_type"), "is not a media type: %v", err)
		}
		row.ContentType = ct
	}
	if in.DelayMS != nil {
		// Compare in milliseconds first: converting a huge value to a
		// Duration would overflow and wrap into the past.
		if *in.DelayMS < 0 || *in.DelayMS > MaxDelay.Milliseconds() {
			return row, httperr.Field(f("delay_ms"), "must be between 0 and %d", MaxDelay.Milliseconds())
		}
		row.VisibleAfter = now.Add(time.Duration(*in.DelayMS) * time.Millisecond)
	}
	return row, nil
}
