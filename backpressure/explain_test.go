package backpressure

import "testing"

func TestHostAllowance(t *testing.T) {
	cases := []struct {
		name                               string
		u                                  HostUsage
		ns                                 string
		wanting                            []string
		wantAllowance, wantShare, wantHold int
	}{
		{"free slots", HostUsage{Limit: 4, InFlight: 1, ByNamespace: map[string]int{"a": 1}}, "a", nil, 3, 4, 1},
		{"full, share used", HostUsage{Limit: 4, InFlight: 4, ByNamespace: map[string]int{"a": 2, "b": 2}}, "a", []string{"b"}, 0, 2, 2},
		{"full, a quiet namespace's guaranteed share", HostUsage{Limit: 4, InFlight: 4, ByNamespace: map[string]int{"b": 4}}, "a", nil, 2, 2, 2},
		{"never past twice the limit", HostUsage{Limit: 2, InFlight: 4, ByNamespace: map[string]int{"b": 4}}, "a", nil, 0, 1, 2},
		{"a wanting namespace with nothing in flight counts", HostUsage{Limit: 6, InFlight: 6, ByNamespace: map[string]int{"a": 3, "b": 3}}, "a", []string{"b", "c"}, 0, 2, 3},
	}
	for _, tc := range cases {
		a, s, h := HostAllowance(tc.u, tc.ns, tc.wanting)
		if a != tc.wantAllowance || s != tc.wantShare || h != tc.wantHold {
			t.Errorf("%s: allowance %d share %d holders %d, want %d %d %d", tc.name, a, s, h, tc.wantAllowance, tc.wantShare, tc.wantHold)
		}
	}
}
