package node_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/node"
)

// keyTarget records, per delivered payload, the Idempotency-Key and
// Fairshard-Dispatch-Key header values exactly as a Go server reads them.
type keyTarget struct {
	mu   sync.Mutex
	seen map[string][2][]string // payload → [Idempotency-Key values, Fairshard-Dispatch-Key values]
}

func (k *keyTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	k.mu.Lock()
	k.seen[string(body)] = [2][]string{r.Header.Values("Idempotency-Key"), r.Header.Values("Fairshard-Dispatch-Key")}
	k.mu.Unlock()
}

func (k *keyTarget) got(payload string) ([2][]string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.seen[payload]
	return v, ok
}

// keyRunes are the characters keys are drawn from: ordinary ones, and
// every kind that an HTTP header could mangle (ASCII and Unicode
// whitespace, C0 and C1 controls, DEL, quotes, percent, non-ASCII).
var keyRunes = []rune{
	'a', 'Z', '0', '9', '-', '_', ':', '/', '.', '?', '#', '%', '"', '\'', '\\', ',', ';', '=', '+', '@', '~',
	' ', '\t', '\n', '\r', '\v', '\f', 0x00, 0x1b, 0x7f,
	0x85, 0xa0, 0x1680, 0x2000, 0x2028, 0x2029, 0x202f, 0x3000, 0xfeff,
	0x80, 0x9f, 'é', 'ß', 'Ж', '中', '✓', '😀', 0xfffd,
}

// acceptable is the documented dispatch_key rule, restated independently
// of node's code: not empty after trimming, no leading or trailing Unicode
// whitespace, no control character (C0 or DEL), at most MaxKeyBytes.
func acceptable(key string) bool {
	if strings.TrimSpace(key) == "" || len(key) > node.MaxKeyBytes || !utf8.ValidString(key) {
		return false
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return false
	}
	return !strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// TestAcceptedKeysArriveIntact: keys survive the trip. Random
// dispatch_keys, built from characters an HTTP header could mangle, are
// appended to a real node that delivers them over real HTTP to a real
// server. A key the API refuses gets 400 naming rows[0].dispatch_key, and
// only when the documented rule refuses it; a key it accepts reaches the
// target's Idempotency-Key (and Fairshard-Dispatch-Key) header byte for
// byte, once.
func TestAcceptedKeysArriveIntact(t *testing.T) {
	kt := &keyTarget{seen: map[string][2][]string{}}
	srv := httptest.NewServer(kt)
	t.Cleanup(srv.Close)
	n := startNode(t, func(cfg *node.Config) { cfg.DefaultTarget = srv.URL + "/keys" })

	var accepted, refused int
	seq := 0
	rapid.Check(t, func(rt *rapid.T) { // 100 keys by default; -rapid.checks=N for more
		part := rapid.OneOf(
			rapid.StringOf(rapid.SampledFrom(keyRunes)),
			rapid.String(),
		)
		// Edges drawn on their own, so leading and trailing characters of
		// every kind come up often, not only when a drawn string has them.
		edge := rapid.OneOf(rapid.Just(""), rapid.Map(rapid.SampledFrom(keyRunes), func(r rune) string { return string(r) }))
		head := edge.Draw(rt, "lead") + part.Draw(rt, "head")
		tail := part.Draw(rt, "tail") + edge.Draw(rt, "trail")
		seq++
		// A unique marker in the middle keeps keys distinct (a repeated key
		// would be a duplicate, not delivered again) and leaves both edges
		// as drawn.
		key := head + "·" + strconv.Itoa(seq) + "·" + tail
		payload := "payload " + strconv.Itoa(seq)
		rows := map[string]any{"rows": []map[string]any{{
			"dispatch_key": key, "payload_base64": base64.StdEncoding.EncodeToString([]byte(payload)),
		}}}
		status, body := n.do(http.MethodPost, "/v1/rows", rows)
		want := acceptable(key)
		switch {
		case status == http.StatusBadRequest:
			var e apiError
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Field != "rows[0].dispatch_key" {
				rt.Fatalf("key %q refused without naming rows[0].dispatch_key: %s", key, body)
			}
			if want {
				rt.Fatalf("key %q refused (%s), but the documented rule accepts it", key, e.Error.Message)
			}
			refused++
			return
		case status != http.StatusOK:
			rt.Fatalf("append of key %q: HTTP %d %s", key, status, body)
		case !want:
			rt.Fatalf("key %q accepted, but the documented rule refuses it", key)
		}
		accepted++
		deadline := time.Now().Add(10 * time.Second)
		for {
			if h, ok := kt.got(payload); ok {
				if len(h[0]) != 1 || h[0][0] != key {
					rt.Fatalf("key %q (% x) arrived as Idempotency-Key %q", key, key, h[0])
				}
				if len(h[1]) != 1 || h[1][0] != key {
					rt.Fatalf("key %q arrived as Fairshard-Dispatch-Key %q", key, h[1])
				}
				return
			}
			if time.Now().After(deadline) {
				rt.Fatalf("key %q accepted but not delivered within 10s", key)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Logf("%d keys accepted and delivered intact, %d refused", accepted, refused)
	if accepted == 0 || refused == 0 {
		t.Fatalf("the generator exercised one side only: %d accepted, %d refused", accepted, refused)
	}
}
