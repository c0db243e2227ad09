package quota

import "fmt"

// Mode is a namespace's quota mode: how its cluster-wide quota becomes
// per-node ceilings. The zero value, ModeDefault, means "not set": Policies
// resolves it to its default mode.
type Mode uint8

const (
	// ModeDefault is an unset mode; a resolved Policy never carries it.
	ModeDefault Mode = iota
	// ModeExact: ceilings are capacity leases from the namespace's
	// coordinator, so the cluster never runs more than the quota at once.
	// A node that cannot reach the coordinator claims nothing new once its
	// lease expires. The default.
	ModeExact
	// ModeProportional: the seed's ceil(quota × owned/total) per node, for
	// users who prefer availability under partition to exactness; the
	// cluster may run up to quota + N − 1 rows at once.
	ModeProportional
)

// String returns "exact", "proportional", or "" for ModeDefault.
func (m Mode) String() string {
	switch m {
	case ModeExact:
		return "exact"
	case ModeProportional:
		return "proportional"
	case ModeDefault:
		return ""
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "exact" or "proportional" (exact spelling, as the API
// shows them). Anything else, the empty string included, is an error
// naming the accepted values.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "exact":
		return ModeExact, nil
	case "proportional":
		return ModeProportional, nil
	}
	return ModeDefault, fmt.Errorf("quota mode %q: want exact or proportional", s)
}

// MarshalText implements encoding.TextMarshaler ("" for ModeDefault), so a
// Mode is a JSON string in the cluster config and the API.
func (m Mode) MarshalText() ([]byte, error) {
	if m > ModeProportional {
		return nil, fmt.Errorf("quota mode %d out of range", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler: "" is ModeDefault,
// otherwise as ParseMode.
func (m *Mode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = ModeDefault
		return nil
	}
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
