package cluster

import (
	"strings"
	"testing"
)

func TestMemberMessageCodec(t *testing.T) {
	q := memberQuery{Nonce: 7, From: "node-ä", Addr: "10.0.0.1:7946"}
	if got, err := decodeMemberQuery(q.encode()); err != nil || got != q {
		t.Fatalf("query round trip: %+v, %v", got, err)
	}
	a := memberAnswer{Nonce: 1 << 40, Sender: "p", Subject: "node-ä", HeldAt: "[fd00::1]:7946"}
	if got, err := decodeMemberAnswer(a.encode()); err != nil || got != a {
		t.Fatalf("answer round trip: %+v, %v", got, err)
	}
	// Every truncation, an oversized name and invalid UTF-8 are errors,
	// never panics.
	for _, b := range [][]byte{q.encode(), a.encode()} {
		for n := 1; n < len(b); n++ {
			if b[0] == msgMemberQuery {
				if _, err := decodeMemberQuery(b[:n]); err == nil {
					t.Errorf("query truncated to %d bytes decoded", n)
				}
			} else if _, err := decodeMemberAnswer(b[:n]); err == nil {
				t.Errorf("answer truncated to %d bytes decoded", n)
			}
		}
	}
	long := memberQuery{From: strings.Repeat("n", MaxNodeNameBytes+1), Addr: "x"}
	if _, err := decodeMemberQuery(long.encode()); err == nil {
		t.Error("a query with a name over MaxNodeNameBytes decoded")
	}
	bad := memberAnswer{Sender: "\xff", Subject: "s"}
	if _, err := decodeMemberAnswer(bad.encode()); err == nil {
		t.Error("an answer with invalid UTF-8 decoded")
	}
	// The kinds never collide with the kv store's (below 0x80).
	if msgMemberQuery < 0x80 || msgMemberAnswer < 0x80 {
		t.Error("member message kinds overlap kv's")
	}
}
