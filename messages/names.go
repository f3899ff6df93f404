package messages

import "fmt"

// MaxNameLen is the longest model, engine, cluster, region or router name accepted.
const MaxNameLen = 64

// ValidName reports whether s can be used as a model, engine, cluster, region or
// router name: 1 to MaxNameLen characters from [A-Za-z0-9_-], so that it is a
// single NATS subject token and a valid KV key part (no dots, spaces or wildcards).
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// CheckName returns nil when name is a valid name (see ValidName), and otherwise
// an error wrapping ErrInvalid that names the field and the value.
func CheckName(field, name string) error {
	if ValidName(name) {
		return nil
	}
	return fmt.Errorf("%w: %s %q is not a valid name (1-%d characters of A-Z a-z 0-9 _ -; no dots, spaces or wildcards)", ErrInvalid, field, name, MaxNameLen)
}
