package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestRowPayloadForms: a payload whose content type is JSON and which
// parses is encoded as "payload", the JSON value, '<' '>' '&' kept;
// anything else as "payload_base64"; each form decodes back to the same
// bytes (compact JSON for the first).
func TestRowPayloadForms(t *testing.T) {
	cases := []struct {
		name, contentType, payload string
		wantJSON                   bool
	}{
		{"json", "application/json", `{"a":[1,2],"html":"<b>&</b>"}`, true},
		{"json with parameters", "application/json; charset=utf-8", `[1]`, true},
		{"+json type", "application/cloudevents+json", `{"id":"x"}`, true},
		{"json type, bytes that do not parse", "application/json", `{not`, false},
		{"text", "text/plain", `"hi"`, false},
		{"binary", "application/octet-stream", "\x00\x01\xff", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// As the node answers it (httperr.WriteJSON: no HTML escaping).
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			err := enc.Encode(Row{DispatchKey: "k", Payload: []byte(c.payload), ContentType: c.contentType})
			b := bytes.TrimSpace(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(b, &fields); err != nil {
				t.Fatal(err)
			}
			_, asJSON := fields["payload"]
			_, asBase64 := fields["payload_base64"]
			if asJSON != c.wantJSON || asBase64 == c.wantJSON {
				t.Fatalf("%s: payload %v, payload_base64 %v; want payload %v", b, asJSON, asBase64, c.wantJSON)
			}
			if c.wantJSON && !bytes.Contains(b, []byte(c.payload)) {
				t.Errorf("%s: want the payload as sent (compact, not HTML-escaped): %s", b, c.payload)
			}
			var back Row
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if string(back.Payload) != c.payload || back.DispatchKey != "k" || back.ContentType != c.contentType {
				t.Errorf("decoded %+v, want payload %q back", back, c.payload)
			}
		})
	}
	// No payload: neither field.
	b, _ := json.Marshal(Row{DispatchKey: "k", ContentType: "application/json"})
	if strings.Contains(string(b), "payload") {
		t.Errorf("a row without a payload encodes %s", b)
	}
}
