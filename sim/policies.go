package sim

import (
	"fmt"
	"math"
	"strings"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// policy routes requests in a run. pick returns the engine for a request
// arriving at cluster c, or -1 to shed it; control is called every control
// period, after the signals of that instant.
type policy interface {
	init(r *run)
	pick(r *run, c int, a *scenario.Arrival) int
	control(r *run)
}

// PolicyNames lists the policies in their report order.
func PolicyNames() []string {
	return []string{"round-robin", "random", "nearest", "proportional", "p2c", "prefix-affinity", "sglang-cache-aware", "llmd-weighted", "feedback-loop", "switchyard"}
}

// ParsePolicies parses a comma-separated list of policy names ("" or "all": every policy).
func ParsePolicies(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return PolicyNames(), nil
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if _, err := newPolicy(n, nil); err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

// newPolicy returns a fresh policy by name (sc may be nil to check the name only).
func newPolicy(name string, sc *scenario.Scenario) (policy, error) {
	switch name {
	case "round-robin":
		return &roundRobin{}, nil
	case "random":
		return &randomPolicy{}, nil
	case "nearest":
		return &nearest{}, nil
	case "proportional":
		return &proportional{}, nil
	case "p2c":
		return &p2c{}, nil
	case "prefix-affinity":
		return &prefixAffinity{}, nil
	case "sglang-cache-aware":
		return &sglangCacheAware{}, nil
	case "llmd-weighted":
		return &llmdWeighted{}, nil
	case "feedback-loop":
		return &feedbackLoop{}, nil
	case "switchyard":
		return &switchyard{}, nil
	}
	return nil, fmt.Errorf("sim: unknown policy %q (want one of %s)", name, strings.Join(PolicyNames(), ", "))
}

// noControl is embedded by policies without a control loop.
type noControl struct{}

func (noControl) init(*run)    {}
func (noControl) control(*run) {}

// roundRobin cycles each router over the engines it considers up.
type roundRobin struct {
	noControl
	next []int
}

func (p *roundRobin) pick(r *run, c int, _ *scenario.Arrival) int {
	if p.next == nil {
		p.next = make([]int, len(r.f.clusters))
	}
	n := len(r.engines)
	for k := 0; k < n; k++ {
		j := (p.next[c] + k) % n
		if !r.down(c, j) {
			p.next[c] = j + 1
			return j
		}
	}
	return -1
}

// randomPolicy picks uniformly among the engines the router considers up.
type randomPolicy struct{ noControl }

func (randomPolicy) pick(r *run, c int, _ *scenario.Arrival) int {
	n := len(r.engines)
	j := r.rng.IntN(n)
	for k := 0; k < n; k++ {
		if !r.down(c, (j+k)%n) {
			return (j + k) % n
		}
	}
	return -1
}

// nearest sends each router's traffic to its nearest live engines,
// round-robin among equally near ones.
type nearest struct {
	noControl
	order [][]int
	next  []int
}

func (p *nearest) pick(r *run, c int, _ *scenario.Arrival) int {
	if p.order == nil {
		p.order = make([][]int, len(r.f.clusters))
		for k := range p.order {
			p.order[k] = r.f.nearestOrder(k)
		}
		p.next = make([]int, len(r.f.clusters))
	}
	ord := p.order[c]
	best := math.Inf(1)
	var group int
	first := -1
	for k, j := range ord {
		if r.down(c, j) {
			continue
		}
		d := r.f.oneWay[c][j]
		if first < 0 {
			first, best = k, d
		}
		if d > best {
			break
		}
		group++
	}
	if first < 0 {
		return -1
	}
	// The group is the live engines at distance best, in order from first.
	n := p.next[c] % group
	p.next[c]++
	for _, j := range ord[first:] {
		if r.down(c, j) {
			continue
		}
		if n == 0 {
			return j
		}
		n--
	}
	return ord[first]
}

// proportional spreads traffic at random in proportion to the engines'
// signalled capacity.
type proportional struct{ noControl }

func (proportional) pick(r *run, c int, _ *scenario.Arrival) int {
	total := 0.0
	for j := range r.engines {
		if !r.down(c, j) {
			total += r.sig[j].capacity
		}
	}
	if !(total > 0) {
		return -1
	}
	u := r.rng.Float64() * total
	last := -1
	for j := range r.engines {
		if r.down(c, j) || !(r.sig[j].capacity > 0) {
			continue
		}
		last = j
		u -= r.sig[j].capacity
		if u < 0 {
			return j
		}
	}
	return last
}

// viewLoad is router c's lagged view of engine j's load: outstanding requests
// at the last signal plus what this router sent since, per batch slot.
func (r *run) viewLoad(c, j int) float64 {
	return float64(r.sig[j].outstanding+int(r.sentSince[c][j])) / float64(r.engines[j].d.typ.MaxBatch)
}

// p2c samples two live engines and takes the less loaded in the router's view.
type p2c struct{ noControl }

func (p2c) pick(r *run, c int, _ *scenario.Arrival) int {
	n := len(r.engines)
	a := r.rng.IntN(n)
	for k := 0; k < n && r.down(c, a); k++ {
		a = (a + 1) % n
	}
	if r.down(c, a) {
		return -1
	}
	b := r.rng.IntN(n)
	for k := 0; k < n && (r.down(c, b) || b == a); k++ {
		b = (b + 1) % n
	}
	if b == a || r.down(c, b) {
		return a
	}
	if r.viewLoad(c, b) < r.viewLoad(c, a) {
		return b
	}
	return a
}

// prefixAffinity is the KV-aware greedy: it takes the engine with the most
// cached leading prompt blocks minus a load term (LoadWeight blocks per
// batch's worth of outstanding requests in the router's view). It reads the
// engines' caches directly, as a KV-event index would.
type prefixAffinity struct{ noControl }

func (prefixAffinity) pick(r *run, c int, a *scenario.Arrival) int {
	lw := r.f.sc.Policies.PrefixAffinity.LoadWeight
	n := len(r.engines)
	start := r.rng.IntN(n)
	best, bestScore := -1, math.Inf(-1)
	for k := 0; k < n; k++ {
		j := (start + k) % n
		if r.down(c, j) {
			continue
		}
		hit := 0
		if len(a.Blocks) > 0 {
			hit = r.engines[j].kv.prefix(a.Blocks)
		}
		score := float64(hit) - lw*r.viewLoad(c, j)
		if score > bestScore {
			best, bestScore = j, score
		}
	}
	return best
}
