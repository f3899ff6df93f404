// Package optimizer states and solves Switchyard's routing problem: given the demand of each
// frontend cluster, the network latency from clusters to engines, and each engine's capacity,
// health and latency profile, it finds the fraction of each cluster's traffic that each engine
// should receive so that the expected end-to-end latency over all traffic is minimal, shedding
// only what cannot be served, lowest priority first.
//
// The package is pure: it performs no I/O besides parsing and rendering byte slices and writers
// given to it, starts no goroutines and holds no package-level mutable state.
package optimizer

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Priority is a demand priority class; lower values are more important.
type Priority int

// The priority classes, from most to least important.
const (
	Critical Priority = iota
	Standard
	Sheddable
)

// NumPriorities is the number of priority classes.
const NumPriorities = 3

// String returns the lower-case name used in problem files.
func (p Priority) String() string {
	switch p {
	case Critical:
		return "critical"
	case Standard:
		return "standard"
	case Sheddable:
		return "sheddable"
	}
	return fmt.Sprintf("priority(%d)", int(p))
}

// Sentinel errors returned (wrapped) by validation and parsing; test for them with errors.Is.
var (
	ErrInvalidName    = errors.New("invalid name")
	ErrDuplicateName  = errors.New("duplicate name")
	ErrNotFinite      = errors.New("number is not finite")
	ErrNegative       = errors.New("number is negative")
	ErrOutOfRange     = errors.New("number out of range")
	ErrUnknownEngine  = errors.New("unknown engine")
	ErrUnknownCluster = errors.New("unknown cluster")
	ErrBadProfile     = errors.New("bad latency profile")
	ErrNoCapacity     = errors.New("demand only for engines of zero capacity")
	ErrBadNetwork     = errors.New("bad network table")
	ErrSyntax         = errors.New("syntax error")
	ErrUnknownKey     = errors.New("unknown key")
	ErrMissingKey     = errors.New("missing key")
	ErrWrongType      = errors.New("wrong type")
	ErrUnknownPolicy  = errors.New("unknown policy")
)

// FieldError reports a bad value: the file (if any), the field path such as
// engines[1].capacity_rps, the offending value and the underlying sentinel error.
type FieldError struct {
	File  string
	Field string
	Value any
	Err   error
}

// Error formats the error as "file: field: value: reason".
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	if e.Value != nil {
		fmt.Fprintf(&b, "%v: ", e.Value)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the underlying sentinel error.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field string, value any, err error, format string, args ...any) error {
	if format != "" {
		err = fmt.Errorf("%w: "+format, append([]any{err}, args...)...)
	}
	return &FieldError{Field: field, Value: value, Err: err}
}

// Cluster is a frontend cluster and its demand.
type Cluster struct {
	// Name identifies the cluster; it must be a NATS token (no dots, spaces or wildcards).
	Name string
	// Demand is the demand in req/s per priority class, indexed by Priority. Demand given
	// without a priority split is counted as Standard.
	Demand [NumPriorities]float64
}

// TotalDemand returns the cluster's demand in req/s over all priority classes.
func (c *Cluster) TotalDemand() float64 {
	return c.Demand[Critical] + c.Demand[Standard] + c.Demand[Sheddable]
}

// Engine is an inference engine.
type Engine struct {
	// Name identifies the engine; it must be a NATS token.
	Name string
	// CapacityRPS is the engine's capacity in req/s at full health.
	CapacityRPS float64
	// Health multiplies the capacity; 1 is fully healthy and 0 takes no traffic.
	Health float64
	// Profile gives the engine-side latency as a function of load.
	Profile Profile
}

// StaleHealthFactor multiplies the health planned for an engine that has
// stopped signalling recently but is not yet known to be down (its state is
// "stale"): it gets less traffic while the aggregator decides, rather than
// all or none. Every builder of a problem from engine state applies it, and
// what shows the planned capacity (the dashboard) uses the same factor.
const StaleHealthFactor = 0.5

// EffectiveCapacity returns CapacityRPS × Health, the hard limit on the engine's load.
func (e *Engine) EffectiveCapacity() float64 { return e.CapacityRPS * e.Health }

// Link is one entry of a cluster's network row: an eligible engine (by index into
// Problem.Engines) and the network latency to it in ms.
type Link struct {
	Engine int
	Ms     float64
}

// Problem is one instance of the routing problem. Clusters and engines are addressed by index;
// names are used only for input and output.
type Problem struct {
	Clusters []Cluster
	Engines  []Engine
	// Network[i] lists the engines eligible to serve cluster i, with the network latency in ms,
	// sorted by engine index. An engine absent from the row may not serve the cluster.
	Network [][]Link
}

// ClusterIndex returns the index of the named cluster, or -1.
func (p *Problem) ClusterIndex(name string) int {
	for i := range p.Clusters {
		if p.Clusters[i].Name == name {
			return i
		}
	}
	return -1
}

// EngineIndex returns the index of the named engine, or -1.
func (p *Problem) EngineIndex(name string) int {
	for j := range p.Engines {
		if p.Engines[j].Name == name {
			return j
		}
	}
	return -1
}

// ValidName reports whether s can name a cluster or an engine: a non-empty NATS token without
// dots, whitespace or wildcards.
func ValidName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == 0x7f {
			return false
		}
	}
	return true
}

func checkNumber(field string, v float64) error {
	if err := numberErr(v); err != nil {
		return fieldErr(field, v, err, "")
	}
	return nil
}

// numberErr returns the sentinel for a value that is NaN, infinite or negative, else nil.
func numberErr(v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return ErrNotFinite
	}
	if v < 0 {
		return ErrNegative
	}
	return nil
}

// Validate checks the problem and returns an error naming the first bad field and its value;
// the error wraps one of the package's sentinel errors.
func (p *Problem) Validate() error {
	clusterSeen := make(map[string]int, len(p.Clusters))
	for i := range p.Clusters {
		c := &p.Clusters[i]
		// The field's path is built only for an error: building it for every cluster and
		// engine was a third of the validation's time on large problems.
		f := func() string { return "clusters[" + strconv.Itoa(i) + "]" }
		if !ValidName(c.Name) {
			return fieldErr(f()+".name", fmt.Sprintf("%q", c.Name), ErrInvalidName, "want a NATS token without dots, spaces or wildcards")
		}
		if k, dup := clusterSeen[c.Name]; dup {
			return fieldErr(f()+".name", c.Name, ErrDuplicateName, "also clusters[%d]", k)
		}
		clusterSeen[c.Name] = i
		for q := range c.Demand {
			if err := numberErr(c.Demand[q]); err != nil {
				return fieldErr(fmt.Sprintf("%s.demand_by_priority.%s", f(), Priority(q)), c.Demand[q], err, "")
			}
		}
	}
	engineSeen := make(map[string]int, len(p.Engines))
	for j := range p.Engines {
		e := &p.Engines[j]
		f := func() string { return "engines[" + strconv.Itoa(j) + "]" }
		if !ValidName(e.Name) {
			return fieldErr(f()+".name", fmt.Sprintf("%q", e.Name), ErrInvalidName, "want a NATS token without dots, spaces or wildcards")
		}
		if k, dup := engineSeen[e.Name]; dup {
			return fieldErr(f()+".name", e.Name, ErrDuplicateName, "also engines[%d]", k)
		}
		engineSeen[e.Name] = j
		if err := numberErr(e.CapacityRPS); err != nil {
			return fieldErr(f()+".capacity_rps", e.CapacityRPS, err, "")
		}
		if err := numberErr(e.Health); err != nil {
			return fieldErr(f()+".health", e.Health, err, "")
		}
		if e.Health > 1 {
			return fieldErr(f()+".health", e.Health, ErrOutOfRange, "want 0..1")
		}
		if e.Profile == nil {
			return fieldErr(f()+".profile", nil, ErrBadProfile, "missing")
		}
		if err := e.Profile.Validate(); err != nil {
			return &FieldError{Field: f() + ".profile", Err: err}
		}
	}
	if len(p.Network) != len(p.Clusters) {
		return fieldErr("network_ms", len(p.Network), ErrBadNetwork, "%d rows for %d clusters", len(p.Network), len(p.Clusters))
	}
	ne := len(p.Engines)
	for i, row := range p.Network {
		prev := -1
		usable := false
		for k, l := range row {
			// One test for the usual case (an engine in range, after the previous one, at a
			// finite latency ≥ 0); the error is worked out only for a bad link.
			if uint(l.Engine) >= uint(ne) || l.Engine <= prev || !(l.Ms >= 0 && l.Ms <= math.MaxFloat64) {
				return p.linkErr(i, k, prev)
			}
			prev = l.Engine
			if !usable && p.Engines[l.Engine].CapacityRPS > 0 {
				usable = true
			}
		}
		if len(row) > 0 && !usable && p.Clusters[i].TotalDemand() > 0 {
			return fieldErr("network_ms."+p.Clusters[i].Name, p.Clusters[i].TotalDemand(), ErrNoCapacity,
				"cluster %s has demand but every engine it may use has capacity_rps 0", p.Clusters[i].Name)
		}
	}
	return nil
}

// linkErr returns the error of link k of cluster i's network row, which follows the engine
// prev (-1 for the first link).
func (p *Problem) linkErr(i, k, prev int) error {
	l := p.Network[i][k]
	if l.Engine < 0 || l.Engine >= len(p.Engines) {
		return fieldErr(fmt.Sprintf("network_ms.%s[%d]", p.Clusters[i].Name, k), l.Engine, ErrUnknownEngine, "engine index out of range")
	}
	if l.Engine <= prev {
		return fieldErr("network_ms."+p.Clusters[i].Name+"."+p.Engines[l.Engine].Name, l.Engine, ErrBadNetwork, "row not sorted by engine index or engine listed twice")
	}
	return fieldErr("network_ms."+p.Clusters[i].Name+"."+p.Engines[l.Engine].Name, l.Ms, numberErr(l.Ms), "")
}
