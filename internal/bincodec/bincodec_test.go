package bincodec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// step is one read in a table case: it performs the read and returns what
// it read, rendered for comparison.
type step struct {
	name string
	read func(r *Reader) any
}

func byteStep() step    { return step{"Byte", func(r *Reader) any { return r.Byte() }} }
func uvarintStep() step { return step{"Uvarint", func(r *Reader) any { return r.Uvarint() }} }
func bytesStep(limit int) step {
	return step{"Bytes", func(r *Reader) any { return string(r.Bytes(limit)) }}
}
func stringStep(limit int) step {
	return step{"String", func(r *Reader) any { return r.String(limit) }}
}
func fixedStep(n int) step {
	return step{"Fixed", func(r *Reader) any { return string(r.Fixed(n)) }}
}

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		steps   []step
		want    []any  // one value per step
		wantErr string // "" for none
		wantLen int    // Len after the steps
	}{
		{
			name:    "every field kind in a row",
			in:      []byte{7, 0xac, 0x02, 2, 'h', 'i', 3, 'a', 0xc3, 0xa9, 0xde, 0xad, 0xbe, 0xef, 9},
			steps:   []step{byteStep(), uvarintStep(), bytesStep(2), stringStep(3), fixedStep(4)},
			want:    []any{byte(7), uint64(300), "hi", "aé", "\xde\xad\xbe\xef"},
			wantLen: 1,
		},
		{
			name:    "byte at the end of the input is truncated",
			in:      []byte{1},
			steps:   []step{byteStep(), byteStep()},
			want:    []any{byte(1), byte(0)},
			wantErr: "truncated",
		},
		{
			name:    "empty input",
			in:      nil,
			steps:   []step{byteStep()},
			want:    []any{byte(0)},
			wantErr: "truncated",
		},
		{
			name:    "uvarint cut inside",
			in:      []byte{0x80, 0x80},
			steps:   []step{uvarintStep()},
			want:    []any{uint64(0)},
			wantErr: "bad varint",
		},
		{
			name:    "uvarint over 64 bits",
			in:      []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
			steps:   []step{uvarintStep()},
			want:    []any{uint64(0)},
			wantErr: "bad varint",
		},
		{
			name:    "length over the limit",
			in:      []byte{5, 'a', 'b', 'c', 'd', 'e'},
			steps:   []step{bytesStep(4)},
			want:    []any{""},
			wantErr: "length 5 above limit 4",
		},
		{
			name:    "huge length over the limit is refused before slicing",
			in:      []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
			steps:   []step{stringStep(64)},
			want:    []any{""},
			wantErr: "length 18446744073709551615 above limit 64",
		},
		{
			name:    "length within the limit but past the end",
			in:      []byte{4, 'a', 'b'},
			steps:   []step{bytesStep(10)},
			want:    []any{""},
			wantErr: "truncated",
		},
		{
			name:    "bad length varint",
			in:      []byte{0x80},
			steps:   []step{stringStep(10)},
			want:    []any{""},
			wantErr: "bad varint",
		},
		{
			name:    "string not UTF-8",
			in:      []byte{2, 0xff, 'a', 1},
			steps:   []step{stringStep(10), byteStep()},
			want:    []any{"", byte(0)},
			wantErr: "string is not valid UTF-8",
		},
		{
			name:    "bytes need not be UTF-8",
			in:      []byte{2, 0xff, 'a'},
			steps:   []step{bytesStep(10)},
			want:    []any{"\xffa"},
			wantErr: "",
		},
		{
			name:    "empty string and bytes",
			in:      []byte{0, 0},
			steps:   []step{stringStep(0), bytesStep(0)},
			want:    []any{"", ""},
			wantErr: "",
		},
		{
			name:    "fixed reads raw bytes",
			in:      []byte{1, 2, 3},
			steps:   []step{fixedStep(2), fixedStep(0)},
			want:    []any{"\x01\x02", ""},
			wantLen: 1,
		},
		{
			name:    "fixed past the end",
			in:      []byte{1, 2, 3},
			steps:   []step{fixedStep(4), byteStep()},
			want:    []any{"", byte(0)},
			wantErr: "truncated",
		},
		{
			name:    "fixed with a negative size",
			in:      []byte{1, 2, 3},
			steps:   []step{fixedStep(-1), byteStep()},
			want:    []any{"", byte(0)},
			wantErr: "length -1 below zero",
		},
		{
			name:    "first error sticks: later reads are zero and keep it",
			in:      []byte{5, 'a', 2, 'b', 'c', 1, 'd', 9, 9, 9},
			steps:   []step{stringStep(1), byteStep(), stringStep(10), bytesStep(10), uvarintStep(), fixedStep(1)},
			want:    []any{"", byte(0), "", "", uint64(0), ""},
			wantErr: "length 5 above limit 1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(tc.in)
			for i, s := range tc.steps {
				if got := s.read(r); got != tc.want[i] {
					t.Errorf("step %d %s = %#v, want %#v", i, s.name, got, tc.want[i])
				}
			}
			gotErr := ""
			if r.Err() != nil {
				gotErr = r.Err().Error()
			}
			if gotErr != tc.wantErr {
				t.Errorf("Err() = %q, want %q", gotErr, tc.wantErr)
			}
			if r.Len() != tc.wantLen {
				t.Errorf("Len() = %d, want %d", r.Len(), tc.wantLen)
			}
		})
	}
}

func TestSentinels(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		read func(r *Reader)
		want error
	}{
		{nil, func(r *Reader) { r.Byte() }, ErrTruncated},
		{[]byte{3, 'a'}, func(r *Reader) { r.Bytes(3) }, ErrTruncated},
		{[]byte{1}, func(r *Reader) { r.Fixed(2) }, ErrTruncated},
		{[]byte{0x80}, func(r *Reader) { r.Uvarint() }, ErrBadVarint},
		{[]byte{1, 0xfe}, func(r *Reader) { r.String(1) }, ErrInvalidUTF8},
	} {
		r := NewReader(tc.in)
		tc.read(r)
		if !errors.Is(r.Err(), tc.want) {
			t.Errorf("%x: Err() = %v, want %v", tc.in, r.Err(), tc.want)
		}
	}
}

func TestFail(t *testing.T) {
	first, second := errors.New("unknown flags"), errors.New("later")
	r := NewReader([]byte{1, 2, 3})
	if r.Byte() != 1 {
		t.Fatal("first byte")
	}
	r.Fail(nil)
	if r.Err() != nil || r.Len() != 2 {
		t.Fatalf("Fail(nil): Err() = %v, Len() = %d; want nil, 2", r.Err(), r.Len())
	}
	r.Fail(first)
	r.Fail(second)
	if r.Err() != first {
		t.Fatalf("Err() = %v, want the first failure %v", r.Err(), first)
	}
	if got := r.Byte(); got != 0 || r.Len() != 0 {
		t.Fatalf("after Fail: Byte() = %d, Len() = %d; want 0, 0", got, r.Len())
	}
	// A read error is not replaced by a later Fail either.
	r = NewReader(nil)
	r.Uvarint()
	r.Fail(first)
	if !errors.Is(r.Err(), ErrBadVarint) {
		t.Fatalf("Err() = %v, want %v", r.Err(), ErrBadVarint)
	}
}

func TestAppendRoundTrip(t *testing.T) {
	long := strings.Repeat("x", 300) // a two-byte length
	var b []byte
	b = AppendString(b, "")
	b = AppendString(b, "héllo")
	b = AppendString(b, long)
	b = AppendBytes(b, nil)
	b = AppendBytes(b, []byte{0, 0xff})
	want := []byte{0, 6, 'h', 0xc3, 0xa9, 'l', 'l', 'o', 0xac, 0x02}
	if !bytes.Equal(b[:len(want)], want) {
		t.Fatalf("encoding starts %x, want %x", b[:len(want)], want)
	}
	r := NewReader(b)
	if got := r.String(0); got != "" {
		t.Errorf("empty string read as %q", got)
	}
	if got := r.String(6); got != "héllo" {
		t.Errorf("got %q", got)
	}
	if got := r.String(300); got != long {
		t.Errorf("long string read as %d bytes", len(got))
	}
	if got := r.Bytes(0); got == nil || len(got) != 0 {
		t.Errorf("empty bytes read as %#v, want empty and non-nil", got)
	}
	got := r.Bytes(2)
	if !bytes.Equal(got, []byte{0, 0xff}) || cap(got) != 2 {
		t.Errorf("bytes read as %x (cap %d)", got, cap(got))
	}
	if r.Err() != nil || r.Len() != 0 {
		t.Fatalf("Err() = %v, Len() = %d after reading everything", r.Err(), r.Len())
	}
}

// FuzzReader reads arbitrary input with a script of reads drawn from the
// input itself: no read panics, reads never consume more than the input,
// and once an error is recorded it stays the same error and every later
// read returns a zero value.
func FuzzReader(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4}, []byte{7, 0xac, 0x02, 2, 'h', 'i', 3, 'a', 0xc3, 0xa9})
	f.Add([]byte{1, 1, 1}, []byte{0x80, 0x80})
	f.Add([]byte{2, 3}, []byte{2, 0xff, 'a', 5, 1, 2, 3, 4, 5})
	f.Add([]byte{4, 4, 4, 4}, []byte{1, 2, 3})
	f.Add([]byte{5, 0, 2}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, script, in []byte) {
		r := NewReader(in)
		var sticky error
		for i, op := range script {
			arg := int(op>>3) - 4 // a limit or size in [-4, 27]: small and negative ones too
			before := r.Len()
			var zero bool
			switch op % 10 {
			case 0:
				zero = r.Byte() == 0
			case 1:
				zero = r.Uvarint() == 0
			case 2:
				zero = r.Bytes(arg) == nil
			case 3:
				zero = r.String(arg) == ""
			case 4:
				zero = r.Fixed(arg) == nil
			case 5:
				if i%2 == 0 {
					r.Fail(errors.New("fail"))
				}
				zero = true
			case 6:
				zero = r.Varint() == 0
			case 7:
				zero = r.Bounded(uint64(max(arg, 0))) == 0 || r.Err() != nil
			case 8:
				zero = r.RawString(arg) == ""
			case 9:
				rest := r.Rest()
				zero = rest == nil
				if len(rest) != r.Len() {
					t.Fatalf("op %d: Rest has %d bytes, Len says %d", i, len(rest), r.Len())
				}
			}
			if r.Len() > before {
				t.Fatalf("op %d: Len grew from %d to %d", i, before, r.Len())
			}
			if sticky != nil {
				if r.Err() != sticky {
					t.Fatalf("op %d: error changed from %v to %v", i, sticky, r.Err())
				}
				if !zero || r.Len() != 0 {
					t.Fatalf("op %d (kind %d): after error %v the read returned a non-zero value or Len %d", i, op%10, sticky, r.Len())
				}
			}
			sticky = r.Err()
		}
	})
}

// The signed varint, the bounded uvarint, the raw string, Rest and Reset.
func TestReaderVarintBoundedRawRest(t *testing.T) {
	b := binary.AppendVarint(nil, -300)
	b = binary.AppendUvarint(b, 1<<32)
	b = AppendString(b, "h\xffi")
	r := NewReader(b)
	if v := r.Varint(); v != -300 {
		t.Fatalf("Varint = %d, want -300", v)
	}
	rest := r.Rest()
	if got := r.Bounded(1<<32 - 1); r.Err() == nil || got != 1<<32 {
		t.Fatalf("Bounded over its maximum: %d, %v; want the value and an error", got, r.Err())
	}
	r.Reset(rest[len(binary.AppendUvarint(nil, 1<<32)):])
	if s := r.RawString(10); s != "h\xffi" || r.Err() != nil {
		t.Fatalf("RawString = %q, %v; want the bytes as they are (no UTF-8 check)", s, r.Err())
	}
	if r.Len() != 0 || len(r.Rest()) != 0 {
		t.Fatalf("after the last field: Len %d, Rest %d", r.Len(), len(r.Rest()))
	}
	r.Reset([]byte{0x80})
	if r.Varint(); !errors.Is(r.Err(), ErrBadVarint) {
		t.Fatalf("a cut varint: %v, want ErrBadVarint", r.Err())
	}
}
