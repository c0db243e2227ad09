package lease_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/lease"
)

func nsName(i int) string { return fmt.Sprintf("ns-%d", i) }

func drawRequest(t *rapid.T) lease.Request {
	n := rapid.IntRange(0, 20).Draw(t, "asks")
	req := lease.Request{
		Node:  rapid.StringMatching(`[a-z0-9.-]{1,20}`).Draw(t, "node"),
		Epoch: rapid.Uint64().Draw(t, "epoch"),
		Asks:  make([]lease.Ask, n),
	}
	for i := range req.Asks {
		req.Asks[i] = lease.Ask{Namespace: nsName(i), Wants: rapid.Uint32().Draw(t, "wants"), Has: rapid.Uint32().Draw(t, "has")}
	}
	return req
}

func TestRequestRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		req := drawRequest(t)
		b, err := lease.EncodeRequest(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := lease.DecodeRequest(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if len(req.Asks) == 0 {
			req.Asks = []lease.Ask{}
		}
		if !reflect.DeepEqual(got, req) {
			t.Fatalf("round trip: %+v → %s → %+v", req, b, got)
		}
	})
}

func TestResponseRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		req := drawRequest(t)
		var resp lease.Response
		resp.Epoch = rapid.Uint64().Draw(t, "epoch")
		for _, a := range req.Asks {
			if rapid.Bool().Draw(t, "coordinated") {
				exp := rapid.Uint32Range(1, lease.MaxLeaseMS).Draw(t, "expiry")
				resp.Leases = append(resp.Leases, lease.Lease{
					Namespace: a.Namespace, Grant: rapid.Uint32().Draw(t, "grant"),
					ExpiryMS: exp, RefreshMS: rapid.Uint32Range(1, exp).Draw(t, "refresh"),
					Learning: rapid.Bool().Draw(t, "learning"),
				})
			} else {
				resp.NotCoordinator = append(resp.NotCoordinator, a.Namespace)
			}
		}
		b, err := lease.EncodeResponse(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := lease.DecodeResponse(bytes.NewReader(b), req)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if resp.Leases == nil {
			resp.Leases = []lease.Lease{}
		}
		if !reflect.DeepEqual(got, resp) {
			t.Fatalf("round trip: %+v → %s → %+v", resp, b, got)
		}
	})
}

// wantField asserts err is a *lease.FieldError naming field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var fe *lease.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T), want a *lease.FieldError for %q", err, err, field)
	}
	if fe.Field != field {
		t.Fatalf("error names field %q (%v), want %q", fe.Field, fe, field)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	ok := `{"node":"n1","epoch":1,"namespaces":[{"namespace":"a","wants":1,"has":0},{"namespace":"b","wants":2,"has":1}]}`
	if _, err := lease.DecodeRequest(strings.NewReader(ok)); err != nil {
		t.Fatalf("the valid base request: %v", err)
	}
	many := make([]string, lease.MaxEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"namespace":"n%d"}`, i)
	}
	cases := []struct{ name, body, field string }{
		{"not JSON", `{"node":`, "body"},
		{"empty body", ``, "body"},
		{"an array", `[]`, "body"},
		{"trailing data", ok + `{}`, "body"},
		{"unknown top field", `{"node":"n1","namespaces":[],"extra":1}`, "extra"},
		{"unknown entry field", `{"node":"n1","namespaces":[{"namespace":"a"},{"namespace":"b","grant":3}]}`, "namespaces[1].grant"},
		{"node missing", `{"namespaces":[]}`, "node"},
		{"node empty", `{"node":"","namespaces":[]}`, "node"},
		{"node too long", `{"node":"` + strings.Repeat("n", 129) + `","namespaces":[]}`, "node"},
		{"node with a control character", `{"node":"n\n1","namespaces":[]}`, "node"},
		{"node not a string", `{"node":5,"namespaces":[]}`, "node"},
		{"epoch negative", `{"node":"n1","epoch":-1,"namespaces":[]}`, "epoch"},
		{"epoch a string", `{"node":"n1","epoch":"1","namespaces":[]}`, "epoch"},
		{"namespaces not a list", `{"node":"n1","namespaces":{}}`, "namespaces"},
		{"wants negative", `{"node":"n1","namespaces":[{"namespace":"a"},{"namespace":"b"},{"namespace":"c","wants":-1}]}`, "namespaces[2].wants"},
		{"has over uint32", `{"node":"n1","namespaces":[{"namespace":"a","has":4294967296}]}`, "namespaces[0].has"},
		{"wants fractional", `{"node":"n1","namespaces":[{"namespace":"a","wants":1.5}]}`, "namespaces[0].wants"},
		{"namespace missing", `{"node":"n1","namespaces":[{"wants":1}]}`, "namespaces[0].namespace"},
		{"namespace with a slash", `{"node":"n1","namespaces":[{"namespace":"a"},{"namespace":"a/b"}]}`, "namespaces[1].namespace"},
		{"namespace too long", `{"node":"n1","namespaces":[{"namespace":"` + strings.Repeat("a", 65) + `"}]}`, "namespaces[0].namespace"},
		{"namespace path traversal", `{"node":"n1","namespaces":[{"namespace":"../../x y\r\n"}]}`, "namespaces[0].namespace"},
		{"namespace twice", `{"node":"n1","namespaces":[{"namespace":"a"},{"namespace":"b"},{"namespace":"a"}]}`, "namespaces[2].namespace"},
		{"too many namespaces", `{"node":"n1","namespaces":[` + strings.Join(many, ",") + `]}`, "namespaces"},
		{"body over the limit", `{"node":"n1","namespaces":[],"pad":"` + strings.Repeat("x", lease.MaxRequestBytes) + `"}`, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := lease.DecodeRequest(strings.NewReader(tc.body))
			wantField(t, err, tc.field)
			if req.Node != "" || req.Asks != nil {
				t.Fatalf("a rejected request decoded to node %q with %d namespaces", req.Node, len(req.Asks))
			}
		})
	}
}

func TestDecodeResponseRejects(t *testing.T) {
	req := lease.Request{Node: "n1", Asks: []lease.Ask{{Namespace: "a"}, {Namespace: "b"}}}
	ok := `{"epoch":2,"leases":[{"namespace":"a","grant":3,"expiry_ms":10000,"refresh_ms":250}],"not_coordinator":["b"]}`
	if _, err := lease.DecodeResponse(strings.NewReader(ok), req); err != nil {
		t.Fatalf("the valid base response: %v", err)
	}
	lease1 := func(ns string, exp, ref int) string {
		return fmt.Sprintf(`{"namespace":%q,"grant":1,"expiry_ms":%d,"refresh_ms":%d}`, ns, exp, ref)
	}
	cases := []struct{ name, body, field string }{
		{"not JSON", `{"leases":[`, "body"},
		{"trailing data", ok + ` 1`, "body"},
		{"unknown field", `{"leases":[],"not_coordinator":["a","b"],"x":1}`, "x"},
		{"unknown lease field", `{"leases":[` + lease1("a", 10, 1) + `,{"namespace":"b","expiry_ms":1,"refresh_ms":1,"wants":1}]}`, "leases[1].wants"},
		{"grant negative", `{"leases":[{"namespace":"a","grant":-1,"expiry_ms":1,"refresh_ms":1}],"not_coordinator":["b"]}`, "leases[0].grant"},
		{"an answer missing", `{"leases":[` + lease1("a", 10, 1) + `]}`, "leases"},
		{"a namespace not asked", `{"leases":[` + lease1("a", 10, 1) + `,` + lease1("c", 10, 1) + `]}`, "leases[1].namespace"},
		{"answered twice", `{"leases":[` + lease1("a", 10, 1) + `],"not_coordinator":["a"]}`, "not_coordinator[0]"},
		{"invalid name", `{"leases":[` + lease1("a", 10, 1) + `],"not_coordinator":["b/c"]}`, "not_coordinator[0]"},
		{"expiry 0", `{"leases":[` + lease1("a", 0, 0) + `],"not_coordinator":["b"]}`, "leases[0].expiry_ms"},
		{"expiry over the limit", `{"leases":[` + lease1("a", lease.MaxLeaseMS+1, 1) + `],"not_coordinator":["b"]}`, "leases[0].expiry_ms"},
		{"refresh 0", `{"leases":[` + lease1("a", 10, 0) + `],"not_coordinator":["b"]}`, "leases[0].refresh_ms"},
		{"refresh over expiry", `{"leases":[` + lease1("a", 10, 11) + `],"not_coordinator":["b"]}`, "leases[0].refresh_ms"},
		{"body over the limit", `{"leases":[],"pad":"` + strings.Repeat("x", lease.MaxResponseBytes) + `"}`, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := lease.DecodeResponse(strings.NewReader(tc.body), req)
			wantField(t, err, tc.field)
			if resp.Leases != nil || resp.NotCoordinator != nil {
				t.Fatalf("a rejected response decoded to %d leases", len(resp.Leases))
			}
		})
	}
}

func TestEncodeRequestRefusesInvalid(t *testing.T) {
	_, err := lease.EncodeRequest(lease.Request{Node: "n1", Asks: []lease.Ask{{Namespace: "a b"}}})
	wantField(t, err, "namespaces[0].namespace")
	b, err := lease.EncodeRequest(lease.Request{Node: "n1"})
	if err != nil || !strings.Contains(string(b), `"namespaces":[]`) {
		t.Fatalf("empty request: %s, %v (want an empty list, not null)", b, err)
	}
}

// The byte limits hold the largest messages the entry limit allows.
func TestWireLimitsFitTheLargestMessages(t *testing.T) {
	req := lease.Request{Node: strings.Repeat("n", lease.MaxNodeNameBytes), Epoch: math.MaxUint64, Asks: make([]lease.Ask, lease.MaxEntries)}
	resp := lease.Response{Epoch: math.MaxUint64, Leases: make([]lease.Lease, lease.MaxEntries)}
	for i := range req.Asks {
		ns := fmt.Sprintf("%064d", i)
		req.Asks[i] = lease.Ask{Namespace: ns, Wants: math.MaxUint32, Has: math.MaxUint32}
		resp.Leases[i] = lease.Lease{Namespace: ns, Grant: math.MaxUint32, ExpiryMS: lease.MaxLeaseMS, RefreshMS: lease.MaxLeaseMS, Learning: true}
	}
	b, err := lease.EncodeRequest(req)
	if err != nil || len(b) > lease.MaxRequestBytes {
		t.Fatalf("largest request: %d bytes (limit %d), %v", len(b), lease.MaxRequestBytes, err)
	}
	if _, err := lease.DecodeRequest(bytes.NewReader(b)); err != nil {
		t.Fatalf("largest request does not decode: %v", err)
	}
	rb, err := lease.EncodeResponse(resp)
	if err != nil || len(rb) > lease.MaxResponseBytes {
		t.Fatalf("largest response: %d bytes (limit %d), %v", len(rb), lease.MaxResponseBytes, err)
	}
	if _, err := lease.DecodeResponse(bytes.NewReader(rb), req); err != nil {
		t.Fatalf("largest response does not decode: %v", err)
	}
	notCoord := lease.Response{Epoch: math.MaxUint64}
	for _, a := range req.Asks {
		notCoord.NotCoordinator = append(notCoord.NotCoordinator, a.Namespace)
	}
	if nb, _ := json.Marshal(notCoord); len(nb) > lease.MaxResponseBytes {
		t.Fatalf("all-not-coordinator response: %d bytes > %d", len(nb), lease.MaxResponseBytes)
	}
	t.Logf("largest request %d bytes, response %d bytes", len(b), len(rb))
}

// Arbitrary bytes never panic the decoders; whatever they accept is valid
// and survives a re-encode.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"node":"n1","epoch":1,"namespaces":[{"namespace":"a","wants":1,"has":0}]}`))
	f.Add([]byte(`{"node":"n1","namespaces":[{"namespace":"a"},{"namespace":"a"}]}`))
	f.Add([]byte(`{"node":"n\u0000","namespaces":null}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := lease.DecodeRequest(bytes.NewReader(data))
		if err != nil {
			var fe *lease.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			return
		}
		if verr := req.Validate(); verr != nil {
			t.Fatalf("accepted an invalid request: %v", verr)
		}
		b, err := lease.EncodeRequest(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := lease.DecodeRequest(bytes.NewReader(b))
		if err != nil || len(again.Asks) != len(req.Asks) || again.Node != req.Node {
			t.Fatalf("re-encode changed the request: %+v vs %+v (%v)", again, req, err)
		}
	})
}
