package transfer_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
)

func genWireRow(t *rapid.T) outbox.Row {
	opt := func(label string) time.Time {
		if rapid.Bool().Draw(t, label+".set") {
			return time.Unix(rapid.Int64Range(-1<<40, 1<<40).Draw(t, label+".s"), rapid.Int64Range(0, 999_999_999).Draw(t, label+".ns")).UTC()
		}
		return time.Time{}
	}
	r := outbox.Row{
		DispatchKey:  rapid.String().Draw(t, "key"),
		WorkflowID:   rapid.String().Draw(t, "wf"),
		Ordinal:      rapid.Uint64().Draw(t, "ordinal"),
		Namespace:    rapid.String().Draw(t, "ns"),
		TaskQueue:    rapid.String().Draw(t, "tq"),
		ActivityType: rapid.String().Draw(t, "act"),
		ContentType:  rapid.String().Draw(t, "ct"),
		Status: rapid.SampledFrom([]outbox.Status{outbox.StatusPending, outbox.StatusClaimed, outbox.StatusDone,
			outbox.StatusFailed, outbox.StatusCancelled}).Draw(t, "status"),
		Attempt:      rapid.Uint32().Draw(t, "attempt"),
		VisibleAfter: opt("visible"),
		ClaimedAt:    opt("claimed"),
		CreatedAt:    opt("created"),
		FinishedAt:   opt("finished"),
		LastError:    rapid.String().Draw(t, "last_error"),
		Shard:        rapid.Uint32().Draw(t, "shard"),
		Version:      outbox.Version{Gen: rapid.Uint32().Draw(t, "gen"), Seq: rapid.Uint64().Draw(t, "seq")},
	}
	switch rapid.IntRange(0, 2).Draw(t, "payload") {
	case 1:
		r.Payload = []byte{}
	case 2:
		r.Payload = rapid.SliceOf(rapid.Byte()).Draw(t, "payload.bytes")
	}
	return r
}

// TestBatchRoundTrip: every field survives the binary encoding, nil and
// empty payloads apart.
func TestBatchRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rows := rapid.SliceOfN(rapid.Custom(genWireRow), 0, 8).Draw(t, "rows")
		enc := transfer.EncodeBatch(nil, rows)
		if len(enc) > transfer.EncodedSize(rows) {
			t.Fatalf("encoded %d bytes, EncodedSize said at most %d", len(enc), transfer.EncodedSize(rows))
		}
		got, err := transfer.DecodeBatch(enc, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 && len(got) == 0 {
			return
		}
		if !reflect.DeepEqual(got, rows) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, rows)
		}
	})
}

func TestDecodeBatchRefusesMalformedInput(t *testing.T) {
	rows := []outbox.Row{{DispatchKey: "k", Namespace: "ns", TaskQueue: "q", Status: outbox.StatusPending, Payload: []byte("p"),
		CreatedAt: time.Unix(5, 6).UTC(), Version: outbox.Version{Seq: 3}}}
	good := transfer.EncodeBatch(nil, rows)
	if _, err := transfer.DecodeBatch(good, 1); err != nil {
		t.Fatal(err)
	}
	// Cut anywhere: refused, never a panic.
	for i := range len(good) {
		if _, err := transfer.DecodeBatch(good[:i], 0); !errors.Is(err, transfer.ErrBadBatch) {
			t.Fatalf("truncated at %d of %d: %v", i, len(good), err)
		}
	}
	for name, b := range map[string][]byte{
		"wrong magic":    append([]byte("JSON"), good[4:]...),
		"trailing bytes": append(append([]byte{}, good...), 0),
		"bad status":     transfer.EncodeBatch(nil, []outbox.Row{{DispatchKey: "k", Status: "weird"}}),
		"huge count":     append(append([]byte{}, good[:4]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := transfer.DecodeBatch(b, 0); !errors.Is(err, transfer.ErrBadBatch) {
			t.Fatalf("%s: %v, want ErrBadBatch", name, err)
		}
	}
	two := transfer.EncodeBatch(nil, append(rows, rows...))
	if _, err := transfer.DecodeBatch(two, 1); !errors.Is(err, transfer.ErrBadBatch) {
		t.Fatalf("two rows with maxRows 1: %v", err)
	}
}

// FuzzDecodeBatch: no input makes DecodeBatch panic, and what it accepts
// survives an encode and decode unchanged.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(transfer.EncodeBatch(nil, nil))
	f.Add(transfer.EncodeBatch(nil, []outbox.Row{{DispatchKey: "k", Namespace: "ns", TaskQueue: "q", Status: outbox.StatusDone,
		Payload: []byte("body"), FinishedAt: time.Unix(1, 2).UTC(), Version: outbox.Version{Gen: 1, Seq: 2}}}))
	f.Add([]byte("FSR\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rows, err := transfer.DecodeBatch(b, 1000)
		if err != nil {
			return
		}
		again, err := transfer.DecodeBatch(transfer.EncodeBatch(nil, rows), 1000)
		if err != nil {
			t.Fatalf("accepted %x, but its re-encoding is refused: %v", b, err)
		}
		if len(rows) > 0 && !reflect.DeepEqual(again, rows) {
			t.Fatalf("accepted %x as %+v; re-encoded it decodes as %+v", b, rows, again)
		}
	})
}
