package protocol

import "strings"

// Priority is a request's priority class. Under overload sheddable requests
// are shed first, then standard ones, critical ones last.
type Priority uint8

// Priority classes, from the first shed to the last.
const (
	PrioritySheddable Priority = iota
	PriorityStandard
	PriorityCritical
	NumPriorities // the number of classes, not a class
)

// String returns the class's name as written in the header, in snapshots
// (ShedByPriority) and in reports (DemandByPriority).
func (p Priority) String() string {
	switch p {
	case PrioritySheddable:
		return "sheddable"
	case PriorityStandard:
		return "standard"
	case PriorityCritical:
		return "critical"
	}
	return "unknown"
}

// ParsePriority parses a priority header value (case-insensitive, spaces
// trimmed); an empty value is PriorityStandard. ok is false for any other
// value.
func ParsePriority(v string) (Priority, bool) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "standard":
		return PriorityStandard, true
	case "critical":
		return PriorityCritical, true
	case "sheddable":
		return PrioritySheddable, true
	}
	return PriorityStandard, false
}
