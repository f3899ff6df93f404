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

// ValidModelName reports whether s can be used as a model name: a valid name
// (see ValidName) other than the words the KV buckets use as key prefixes of
// their own records beside the model-keyed ones — "operator" (operator
// overrides in sy_engines), "penalty" (penalty records in sy_engines) and
// "rtt" (RTT records in sy_demand). A model named "operator" would otherwise
// share its engine-state keys (<model>.<engine>) with the operator overrides
// (operator.<engine>).
func ValidModelName(s string) bool {
	switch s {
	case "operator", "penalty", "rtt":
		return false
	}
	return ValidName(s)
}

// CheckModelName returns nil when name is a valid model name (see
// ValidModelName), and otherwise an error wrapping ErrInvalid that says why.
func CheckModelName(name string) error {
	if ValidName(name) && !ValidModelName(name) {
		return fmt.Errorf("%w: model %q is a reserved word (operator, penalty and rtt prefix other records in the KV buckets)", ErrInvalid, name)
	}
	return CheckName("model", name)
}

// CheckName returns nil when name is a valid name (see ValidName), and otherwise
// an error wrapping ErrInvalid that names the field and the value.
func CheckName(field, name string) error {
	if ValidName(name) {
		return nil
	}
	return fmt.Errorf("%w: %s %q is not a valid name (1-%d characters of A-Z a-z 0-9 _ -; no dots, spaces or wildcards)", ErrInvalid, field, name, MaxNameLen)
}
