package optimizer

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// ParseProblem parses a problem file in YAML or JSON (the same keys; JSON is read as YAML):
//
//	clusters:
//	  - name: A
//	    demand_rps: 90            # or demand_by_priority: {critical: 10, standard: 70, sheddable: 10}
//	engines:
//	  - name: engine-a
//	    capacity_rps: 100
//	    health: 1.0               # optional, default 1
//	    profile: {kind: queue, base_ms: 400}   # or {kind: points, points: [[0, 400], [90, 900]]}
//	network_ms:
//	  A: {engine-a: 1}
//
// Parsing is strict: unknown or duplicate keys, wrong types, NaN, infinite or negative numbers,
// unknown names and the other problems Problem.Validate finds are errors. Errors are
// *FieldError values naming filename, the field path (such as engines[1].capacity_rps) and the
// value, wrapping a sentinel error. ParseProblem never panics.
func ParseProblem(filename string, data []byte) (p *Problem, err error) {
	defer func() {
		if r := recover(); r != nil { // defensive: the YAML library must not take us down
			p, err = nil, &FieldError{File: filename, Err: fmt.Errorf("%w: %v", ErrSyntax, r)}
		}
		var fe *FieldError
		if err != nil && errors.As(err, &fe) && fe.File == "" {
			fe.File = filename
		}
	}()
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, &FieldError{File: filename, Err: fmt.Errorf("%w: %v", ErrSyntax, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &FieldError{File: filename, Err: fmt.Errorf("%w: more than one YAML document", ErrSyntax)}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &FieldError{File: filename, Err: fmt.Errorf("%w: empty document", ErrSyntax)}
	}
	root := doc.Content[0]
	top, err := mapping(root, "", "clusters", "engines", "network_ms")
	if err != nil {
		return nil, err
	}
	p = &Problem{}
	for _, key := range []string{"clusters", "engines", "network_ms"} {
		if top[key] == nil {
			return nil, fieldErr(key, nil, ErrMissingKey, "")
		}
	}
	clusters, err := sequence(top["clusters"], "clusters")
	if err != nil {
		return nil, err
	}
	for i, n := range clusters {
		f := "clusters[" + strconv.Itoa(i) + "]"
		c, err := parseCluster(n, f)
		if err != nil {
			return nil, err
		}
		p.Clusters = append(p.Clusters, c)
	}
	engines, err := sequence(top["engines"], "engines")
	if err != nil {
		return nil, err
	}
	for j, n := range engines {
		f := "engines[" + strconv.Itoa(j) + "]"
		e, err := parseEngine(n, f)
		if err != nil {
			return nil, err
		}
		p.Engines = append(p.Engines, e)
	}
	if err := parseNetwork(p, top["network_ms"]); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

// mapping returns the values of a mapping node by key, rejecting unknown and duplicate keys.
// With no allowed keys, any key is accepted.
func mapping(n *yaml.Node, field string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, fieldErr(field, kindName(n), ErrWrongType, "want a mapping (line %d)", n.Line)
	}
	m := make(map[string]*yaml.Node, len(n.Content)/2)
	for k := 0; k+1 < len(n.Content); k += 2 {
		kn := n.Content[k]
		key := kn.Value
		path := key
		if field != "" {
			path = field + "." + key
		}
		if kn.Kind != yaml.ScalarNode {
			return nil, fieldErr(field, kindName(kn), ErrWrongType, "keys must be strings (line %d)", kn.Line)
		}
		if len(allowed) > 0 && !contains(allowed, key) {
			return nil, fieldErr(path, nil, ErrUnknownKey, "line %d; allowed keys: %v", kn.Line, allowed)
		}
		if _, dup := m[key]; dup {
			return nil, fieldErr(path, nil, ErrDuplicateName, "key given twice (line %d)", kn.Line)
		}
		m[key] = n.Content[k+1]
	}
	return m, nil
}

// keys returns the keys of a mapping node in file order.
func keys(n *yaml.Node) []string {
	var ks []string
	for k := 0; k+1 < len(n.Content); k += 2 {
		ks = append(ks, n.Content[k].Value)
	}
	return ks
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sequence(n *yaml.Node, field string) ([]*yaml.Node, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, fieldErr(field, kindName(n), ErrWrongType, "want a list (line %d)", n.Line)
	}
	return n.Content, nil
}

func str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
		return "", fieldErr(field, kindName(n), ErrWrongType, "want a string (line %d)", n.Line)
	}
	return n.Value, nil
}

// number parses a finite non-negative number.
func number(n *yaml.Node, field string) (float64, error) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		return 0, fieldErr(field, kindName(n), ErrWrongType, "want a number (line %d)", n.Line)
	}
	var v float64
	if err := n.Decode(&v); err != nil {
		return 0, fieldErr(field, n.Value, ErrWrongType, "want a number (line %d)", n.Line)
	}
	if err := numberErr(v); err != nil {
		return 0, fieldErr(field, n.Value, err, "line %d", n.Line)
	}
	return v, nil
}

func parseCluster(n *yaml.Node, f string) (Cluster, error) {
	var c Cluster
	m, err := mapping(n, f, "name", "demand_rps", "demand_by_priority")
	if err != nil {
		return c, err
	}
	if m["name"] == nil {
		return c, fieldErr(f+".name", nil, ErrMissingKey, "")
	}
	if c.Name, err = str(m["name"], f+".name"); err != nil {
		return c, err
	}
	switch d, dp := m["demand_rps"], m["demand_by_priority"]; {
	case d != nil && dp != nil:
		return c, fieldErr(f, nil, ErrDuplicateName, "give demand_rps or demand_by_priority, not both")
	case d != nil:
		if c.Demand[Standard], err = number(d, f+".demand_rps"); err != nil {
			return c, err
		}
	case dp != nil:
		pm, err := mapping(dp, f+".demand_by_priority", "critical", "standard", "sheddable")
		if err != nil {
			return c, err
		}
		for q := Critical; q < NumPriorities; q++ {
			if v := pm[q.String()]; v != nil {
				if c.Demand[q], err = number(v, f+".demand_by_priority."+q.String()); err != nil {
					return c, err
				}
			}
		}
	default:
		return c, fieldErr(f+".demand_rps", nil, ErrMissingKey, "give demand_rps or demand_by_priority")
	}
	return c, nil
}

func parseEngine(n *yaml.Node, f string) (Engine, error) {
	e := Engine{Health: 1}
	m, err := mapping(n, f, "name", "capacity_rps", "health", "profile")
	if err != nil {
		return e, err
	}
	for _, k := range []string{"name", "capacity_rps", "profile"} {
		if m[k] == nil {
			return e, fieldErr(f+"."+k, nil, ErrMissingKey, "")
		}
	}
	if e.Name, err = str(m["name"], f+".name"); err != nil {
		return e, err
	}
	if e.CapacityRPS, err = number(m["capacity_rps"], f+".capacity_rps"); err != nil {
		return e, err
	}
	if h := m["health"]; h != nil {
		if e.Health, err = number(h, f+".health"); err != nil {
			return e, err
		}
		if e.Health > 1 {
			return e, fieldErr(f+".health", h.Value, ErrOutOfRange, "want 0..1 (line %d)", h.Line)
		}
	}
	e.Profile, err = parseProfile(m["profile"], f+".profile")
	return e, err
}

func parseProfile(n *yaml.Node, f string) (Profile, error) {
	m, err := mapping(n, f, "kind", "base_ms", "points")
	if err != nil {
		return nil, err
	}
	if m["kind"] == nil {
		return nil, fieldErr(f+".kind", nil, ErrMissingKey, "want queue or points")
	}
	kind, err := str(m["kind"], f+".kind")
	if err != nil {
		return nil, err
	}
	switch kind {
	case "queue":
		if m["points"] != nil {
			return nil, fieldErr(f+".points", nil, ErrUnknownKey, "not allowed for kind queue")
		}
		if m["base_ms"] == nil {
			return nil, fieldErr(f+".base_ms", nil, ErrMissingKey, "")
		}
		b, err := number(m["base_ms"], f+".base_ms")
		if err != nil {
			return nil, err
		}
		q := QueueProfile{BaseMs: b}
		if err := q.Validate(); err != nil {
			return nil, fieldErr(f+".base_ms", b, ErrBadProfile, "want a positive latency")
		}
		return q, nil
	case "points":
		if m["base_ms"] != nil {
			return nil, fieldErr(f+".base_ms", nil, ErrUnknownKey, "not allowed for kind points")
		}
		if m["points"] == nil {
			return nil, fieldErr(f+".points", nil, ErrMissingKey, "")
		}
		seq, err := sequence(m["points"], f+".points")
		if err != nil {
			return nil, err
		}
		pts := make([][2]float64, len(seq))
		for k, pn := range seq {
			pf := f + ".points[" + strconv.Itoa(k) + "]"
			pair, err := sequence(pn, pf)
			if err != nil {
				return nil, err
			}
			if len(pair) != 2 {
				return nil, fieldErr(pf, len(pair), ErrWrongType, "want [load_rps, latency_ms] (line %d)", pn.Line)
			}
			for c := 0; c < 2; c++ {
				if pts[k][c], err = number(pair[c], pf+"["+strconv.Itoa(c)+"]"); err != nil {
					return nil, err
				}
			}
		}
		pp, err := NewPointsProfile(pts)
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Field = f + "." + fe.Field
			}
			return nil, err
		}
		return pp, nil
	}
	return nil, fieldErr(f+".kind", kind, ErrBadProfile, "want queue or points")
}

func parseNetwork(p *Problem, n *yaml.Node) error {
	rows, err := mapping(n, "network_ms")
	if err != nil {
		return err
	}
	p.Network = make([][]Link, len(p.Clusters))
	clusterIdx := make(map[string]int, len(p.Clusters))
	for i := range p.Clusters {
		if _, dup := clusterIdx[p.Clusters[i].Name]; !dup {
			clusterIdx[p.Clusters[i].Name] = i
		}
	}
	engineIdx := make(map[string]int, len(p.Engines))
	for j := range p.Engines {
		if _, dup := engineIdx[p.Engines[j].Name]; !dup {
			engineIdx[p.Engines[j].Name] = j
		}
	}
	for _, cname := range keys(n) {
		f := "network_ms." + cname
		i, ok := clusterIdx[cname]
		if !ok {
			return fieldErr(f, cname, ErrUnknownCluster, "no cluster of that name")
		}
		row, err := mapping(rows[cname], f)
		if err != nil {
			return err
		}
		links := make([]Link, 0, len(row))
		for _, ename := range keys(rows[cname]) {
			j, ok := engineIdx[ename]
			if !ok {
				return fieldErr(f+"."+ename, ename, ErrUnknownEngine, "no engine of that name")
			}
			ms, err := number(row[ename], f+"."+ename)
			if err != nil {
				return err
			}
			links = append(links, Link{Engine: j, Ms: ms})
		}
		sort.Slice(links, func(a, b int) bool { return links[a].Engine < links[b].Engine })
		p.Network[i] = links
	}
	return nil
}

// finite maps non-finite numbers to nil so that JSON output stays valid.
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
