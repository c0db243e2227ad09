package lease

import (
	"unicode"
	"unicode/utf8"
)

// MaxNamespaceBytes is the longest namespace name (bytes), as in the
// public API (node.ValidName).
const MaxNamespaceBytes = 64

// MaxNodeNameBytes is the longest node name (bytes), as in
// cluster.MaxNodeNameBytes.
const MaxNodeNameBytes = 128

// ValidNamespace reports whether s is a valid namespace name: 1 to 64
// bytes of ASCII letters, digits, '-', '_' and '.'. It is the public API's
// rule (node.ValidName, `^[A-Za-z0-9._-]{1,64}$`), written as a loop
// because a coordinator checks up to MaxEntries names per call; a test
// pins the two together.
func ValidNamespace(s string) bool {
	if len(s) == 0 || len(s) > MaxNamespaceBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// ValidNodeName reports whether s can be a node name on the wire: 1 to 128
// bytes (cluster.MaxNodeNameBytes) of valid UTF-8 without control
// characters.
func ValidNodeName(s string) bool {
	if len(s) == 0 || len(s) > MaxNodeNameBytes || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
