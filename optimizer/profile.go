package optimizer

import (
	"fmt"
	"math"
	"sort"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Profile describes how an engine's latency grows with its load. A profile is bound to an
// engine's capacity and health with Curve.
type Profile interface {
	// Kind returns the profile kind as written in problem files ("queue" or "points").
	Kind() string
	// Validate reports whether the profile's parameters are usable.
	Validate() error
	// Curve returns the latency curve of an engine with the given capacity (req/s) and health
	// multiplier (0..1); health scales the capacity.
	Curve(capacity, health float64) Curve
}

// Curve is a latency profile bound to an engine: engine-side latency L(x) in ms at load x req/s,
// increasing and convex, with a hard load limit. It is the solver's view of an engine
// (flow.Curve, where its methods are documented): the solver uses the marginal cost
// F'(x) = d/dx (x·L(x)) and its inverse.
type Curve = flow.Curve

// QueueCapFraction is the fraction of a queue engine's effective capacity that the solver may
// load it to: the queue latency diverges at capacity, so the load is kept strictly below it.
const QueueCapFraction = 1 - 1e-6

// QueueProfile is the queueing model L(x) = BaseMs / (1 - x/C), where C is the engine's
// effective capacity; the latency diverges as the load approaches capacity.
type QueueProfile struct {
	// BaseMs is the latency at zero load, in ms.
	BaseMs float64
}

// Kind returns "queue".
func (q QueueProfile) Kind() string { return "queue" }

// Validate checks that BaseMs is finite and positive.
func (q QueueProfile) Validate() error {
	if math.IsNaN(q.BaseMs) || math.IsInf(q.BaseMs, 0) {
		return fieldErr("base_ms", q.BaseMs, ErrNotFinite, "")
	}
	if q.BaseMs <= 0 {
		return fieldErr("base_ms", q.BaseMs, ErrBadProfile, "want a positive latency")
	}
	return nil
}

// Curve binds the queue profile to an engine.
func (q QueueProfile) Curve(capacity, health float64) Curve {
	c := capacity * health
	return &queueCurve{b: q.BaseMs, c: c, cap: c * QueueCapFraction}
}

// queueCurve is the queue profile bound to an engine, with the congestion term a·x²/2 added
// to its cost x·L(x) (a = 0: none; see congested). With the term, mcap is the marginal cost at
// the hard limit and prevW the last root InverseMarginal found (see there); a curve belongs to
// one solver's state, which is not shared between goroutines.
type queueCurve struct{ b, c, cap, a, mcap, prevW float64 }

func (q *queueCurve) Capacity() float64 { return q.cap }

func (q *queueCurve) Latency(x float64) float64 {
	if x <= 0 {
		return q.b
	}
	if x >= q.c {
		return math.Inf(1)
	}
	return q.b/(1-x/q.c) + 0.5*q.a*x
}

func (q *queueCurve) Marginal(x float64) float64 {
	if x <= 0 {
		return q.b
	}
	if x >= q.c {
		return math.Inf(1)
	}
	r := 1 - x/q.c
	return q.b/(r*r) + q.a*x
}

func (q *queueCurve) InverseMarginal(m float64) (float64, float64) {
	if q.c <= 0 || m <= q.b {
		return 0, 0
	}
	if q.a <= 0 {
		s := math.Sqrt(q.b / m)
		x := q.c * (1 - s)
		if x >= q.cap {
			return q.cap, 0
		}
		return x, 0.5 * q.c * s / m
	}
	if m >= q.mcap {
		return q.cap, 0 // the root is at or beyond the hard limit
	}
	// With the congestion term the root of b/r² + a·x = m, r = 1 − x/c, is in w = x/(c − x)
	// the root of the cubic H(w) = b·w³ + 3b·w² + (3b + A − m)·w + (b − m), A = a·c, which is
	// convex on w > −1 and increasing right of its root. From an upper bound of the root
	// Newton falls monotonically onto it with one division a step. Newton's convergence is
	// quadratic: once a step is below 1e-7 of w, the error after it is of the order of 1e-14.
	b := q.b
	k1, k0 := 3*b+q.a*q.c-m, b-m
	// The solver asks for nearby marginals in turn, so the previous root gives the bound:
	// above the new root it is one, below it one Newton step from it is one (H is convex, so
	// its tangent's root lies right of H's). Without it (or where H falls there), two upper
	// bounds do: the root without the term, w = √(m/b) − 1, and H's tangent at 0 (when it
	// rises), the lower of them. The previous root spares the square root and two divisions.
	w := 0.0
	if pw := q.prevW; pw > 0 {
		if h := ((b*pw+3*b)*pw+k1)*pw + k0; h >= 0 {
			w = pw
		} else if d := (3*b*pw+6*b)*pw + k1; d > 0 {
			w = pw - h/d
		}
	}
	if !(w > 0) {
		w = math.Sqrt(m/b) - 1
		if k1 > 0 {
			w = math.Min(w, -k0/k1)
		}
	}
	var d float64
	for range 50 {
		d = (3*b*w+6*b)*w + k1
		step := (((b*w+3*b)*w+k1)*w + k0) / d
		w -= step
		if w <= 0 {
			return 0, 0
		}
		if step <= 1e-7*w {
			break
		}
	}
	// x = c·w/(1+w), and dx/dm = c/((1+w)·H'(w)) by implicit differentiation of H.
	q.prevW = w
	d = (3*b*w+6*b)*w + k1
	t := q.c / ((1 + w) * d)
	return w * d * t, t
}

func (q *queueCurve) InverseLatency(l float64) (float64, float64) {
	if q.a > 0 {
		return inverseLatency(q, l)
	}
	if q.c <= 0 || l <= q.b {
		return 0, 0
	}
	x := q.c * (1 - q.b/l)
	if x >= q.cap {
		return q.cap, 0
	}
	return x, q.c * q.b / (l * l)
}

// PointsProfile is a piecewise-linear latency profile through measured (load_rps, latency_ms)
// points, extended flat to load 0 and linearly beyond the last point. NewPointsProfile makes the
// points increasing and convex; Notes says what it changed. Health scales the load axis: an
// engine at health h reaches latency L(x) at load h·x.
type PointsProfile struct {
	// Points are the (load_rps, latency_ms) points after repair, sorted, starting at load 0.
	Points [][2]float64
	// Notes describe changes made to the measured points, if any.
	Notes []string
	slope []float64 // slope[k] of segment k; slope[len-1] is the extrapolation slope
}

// minSlope keeps divisions finite on flat segments; it does not change latencies.
const minSlope = 1e-9

// NewPointsProfile checks the points and repairs them into an increasing convex profile.
// It returns an error wrapping ErrBadProfile (or ErrNotFinite, ErrNegative) naming the point.
func NewPointsProfile(points [][2]float64) (*PointsProfile, error) {
	if len(points) == 0 {
		return nil, fieldErr("points", nil, ErrBadProfile, "no points")
	}
	for k, pt := range points {
		for c := 0; c < 2; c++ {
			if err := checkNumber(fmt.Sprintf("points[%d][%d]", k, c), pt[c]); err != nil {
				return nil, err
			}
		}
	}
	pts := make([][2]float64, len(points))
	copy(pts, points)
	var notes []string
	if !sort.SliceIsSorted(pts, func(a, b int) bool { return pts[a][0] < pts[b][0] }) {
		sort.SliceStable(pts, func(a, b int) bool { return pts[a][0] < pts[b][0] })
		notes = append(notes, "points sorted by load")
	}
	// Merge equal loads, keeping the highest latency.
	merged := pts[:1]
	for _, pt := range pts[1:] {
		last := &merged[len(merged)-1]
		if pt[0] == last[0] {
			if pt[1] != last[1] {
				notes = append(notes, fmt.Sprintf("two latencies at load %g: kept %g", pt[0], math.Max(pt[1], last[1])))
			}
			last[1] = math.Max(last[1], pt[1])
			continue
		}
		merged = append(merged, pt)
	}
	pts = merged
	if pts[0][0] > 0 {
		pts = append([][2]float64{{0, pts[0][1]}}, pts...)
	}
	// Increasing: running maximum.
	for k := 1; k < len(pts); k++ {
		if pts[k][1] < pts[k-1][1] {
			notes = append(notes, fmt.Sprintf("latency at load %g raised from %g to %g to make the profile increasing", pts[k][0], pts[k][1], pts[k-1][1]))
			pts[k][1] = pts[k-1][1]
		}
	}
	// Convex: lower convex hull (slopes are non-negative because the points are increasing).
	hull := make([][2]float64, 0, len(pts))
	for _, pt := range pts {
		for len(hull) >= 2 {
			a, b := hull[len(hull)-2], hull[len(hull)-1]
			// b is above the chord from a to pt: drop it.
			if (b[1]-a[1])*(pt[0]-a[0]) >= (pt[1]-a[1])*(b[0]-a[0]) {
				if (b[1]-a[1])*(pt[0]-a[0]) > (pt[1]-a[1])*(b[0]-a[0]) {
					notes = append(notes, fmt.Sprintf("point (%g, %g) dropped to make the profile convex", b[0], b[1]))
				}
				hull = hull[:len(hull)-1]
				continue
			}
			break
		}
		hull = append(hull, pt)
	}
	p := &PointsProfile{Points: hull, Notes: notes}
	p.init()
	return p, nil
}

func (p *PointsProfile) init() {
	n := len(p.Points)
	p.slope = make([]float64, n)
	for k := 0; k+1 < n; k++ {
		p.slope[k] = (p.Points[k+1][1] - p.Points[k][1]) / (p.Points[k+1][0] - p.Points[k][0])
	}
	if n >= 2 {
		p.slope[n-1] = p.slope[n-2]
	}
}

// Kind returns "points".
func (p *PointsProfile) Kind() string { return "points" }

// Validate checks that the profile was built by NewPointsProfile or is otherwise consistent.
func (p *PointsProfile) Validate() error {
	if p == nil || len(p.Points) == 0 {
		return fieldErr("points", nil, ErrBadProfile, "no points")
	}
	if p.Points[0][0] != 0 {
		return fieldErr("points[0][0]", p.Points[0][0], ErrBadProfile, "must start at load 0; build the profile with NewPointsProfile")
	}
	for k := range p.Points {
		for c := 0; c < 2; c++ {
			if err := numberErr(p.Points[k][c]); err != nil {
				return fieldErr(fmt.Sprintf("points[%d][%d]", k, c), p.Points[k][c], err, "")
			}
		}
		if k > 0 && !(p.Points[k][0] > p.Points[k-1][0]) {
			return fieldErr(fmt.Sprintf("points[%d][0]", k), p.Points[k][0], ErrBadProfile, "loads must increase; build the profile with NewPointsProfile")
		}
	}
	if len(p.slope) != len(p.Points) {
		p.init()
	}
	for k := 1; k < len(p.slope); k++ {
		if p.slope[k] < p.slope[k-1]-1e-12*math.Abs(p.slope[k-1]) || p.slope[k-1] < 0 {
			return fieldErr(fmt.Sprintf("points[%d]", k), p.Points[k], ErrBadProfile, "profile is not increasing and convex; build it with NewPointsProfile")
		}
	}
	return nil
}

// Curve binds the profile to an engine; the hard load limit is capacity × health.
func (p *PointsProfile) Curve(capacity, health float64) Curve {
	if len(p.slope) != len(p.Points) {
		p.init()
	}
	return &pointsCurve{p: p, h: health, cap: capacity * health}
}

// pointsCurve is a points profile bound to an engine, with the congestion term a·x²/2 added
// to its cost x·L(x) (a = 0: none; see congested).
type pointsCurve struct {
	p   *PointsProfile
	h   float64
	cap float64
	a   float64
}

func (c *pointsCurve) Capacity() float64 { return c.cap }

// seg returns the segment containing load u (on the profile's own axis).
func (c *pointsCurve) seg(u float64) int {
	pts := c.p.Points
	// largest k with pts[k][0] <= u
	k := sort.Search(len(pts), func(k int) bool { return pts[k][0] > u }) - 1
	if k < 0 {
		k = 0
	}
	return k
}

func (c *pointsCurve) unit(x float64) float64 {
	if c.h <= 0 {
		if x <= 0 {
			return 0
		}
		return math.Inf(1)
	}
	return x / c.h
}

func (c *pointsCurve) Latency(x float64) float64 {
	u := c.unit(x)
	if math.IsInf(u, 1) {
		return math.Inf(1)
	}
	k := c.seg(u)
	pt := c.p.Points[k]
	return pt[1] + c.p.slope[k]*(u-pt[0]) + 0.5*c.a*x
}

func (c *pointsCurve) Marginal(x float64) float64 {
	u := c.unit(x)
	if math.IsInf(u, 1) {
		return math.Inf(1)
	}
	k := c.seg(u)
	pt := c.p.Points[k]
	s := c.p.slope[k]
	return pt[1] + s*(u-pt[0]) + u*s + c.a*x
}

func (c *pointsCurve) clamp(u, slope float64) (float64, float64) {
	x := u * c.h
	if x >= c.cap {
		return c.cap, 0
	}
	return x, slope * c.h
}

func (c *pointsCurve) InverseMarginal(m float64) (float64, float64) {
	if c.cap <= 0 {
		return 0, 0
	}
	pts, sl := c.p.Points, c.p.slope
	// On the profile's axis u = x/h the marginal cost is pts[k][1] + sl[k]·(2u − pts[k][0])
	// plus the congestion term's a·h·u; at the start of segment k it is
	// pts[k][1] + (sl[k] + a·h)·pts[k][0], which increases with k.
	ah := c.a * c.h
	k := sort.Search(len(pts), func(k int) bool { return pts[k][1]+(sl[k]+ah)*pts[k][0] > m }) - 1
	if k < 0 {
		return 0, 0
	}
	s := math.Max(2*sl[k]+ah, minSlope)
	a := pts[k][1] - sl[k]*pts[k][0]
	u := (m - a) / s
	if k+1 < len(pts) && u >= pts[k+1][0] {
		return c.clamp(pts[k+1][0], 0)
	}
	if u < pts[k][0] {
		u = pts[k][0]
	}
	return c.clamp(u, 1/s)
}

func (c *pointsCurve) InverseLatency(l float64) (float64, float64) {
	if c.a > 0 {
		return inverseLatency(c, l)
	}
	if c.cap <= 0 {
		return 0, 0
	}
	pts, sl := c.p.Points, c.p.slope
	k := sort.Search(len(pts), func(k int) bool { return pts[k][1] > l }) - 1
	if k < 0 {
		return 0, 0
	}
	s := math.Max(sl[k], minSlope)
	u := pts[k][0] + (l-pts[k][1])/s
	if k+1 < len(pts) && u >= pts[k+1][0] {
		return c.clamp(pts[k+1][0], 0)
	}
	return c.clamp(u, 1/s)
}

// congested returns c with the congestion term a·x²/2 added to its cost x·L(x): the latency
// gains a·x/2 and the marginal cost a·x, so that the cost is strictly convex in the load even
// where the profile is flat (Options.Congestion). A curve of another Profile is wrapped.
func congested(c Curve, a float64) Curve {
	if !(a > 0) || math.IsInf(a, 0) {
		return c
	}
	switch v := c.(type) {
	case *queueCurve:
		q := *v
		q.a = a
		q.mcap = q.Marginal(q.cap)
		return &q
	case *pointsCurve:
		p := *v
		p.a = a
		return &p
	}
	return &congestedCurve{c: c, a: a}
}

// congestedCurve adds the congestion term to a curve of a Profile outside this package; its
// inverses bisect.
type congestedCurve struct {
	c Curve
	a float64
}

func (w *congestedCurve) Capacity() float64          { return w.c.Capacity() }
func (w *congestedCurve) Latency(x float64) float64  { return w.c.Latency(x) + 0.5*w.a*x }
func (w *congestedCurve) Marginal(x float64) float64 { return w.c.Marginal(x) + w.a*x }
func (w *congestedCurve) InverseMarginal(m float64) (float64, float64) {
	return invert(w, w.Marginal, m)
}
func (w *congestedCurve) InverseLatency(l float64) (float64, float64) {
	return inverseLatency(w, l)
}

// inverseLatency inverts c's Latency by bisection (InverseLatency serves only the
// least-latency policy, which solves without the congestion term).
func inverseLatency(c Curve, l float64) (float64, float64) {
	return invert(c, c.Latency, l)
}

// invert returns the largest load x in [0, c.Capacity()] with f(x) ≤ v for an increasing f,
// by bisection, and dx/dv there from a finite difference (0 when clamped).
func invert(c Curve, f func(float64) float64, v float64) (float64, float64) {
	hi := c.Capacity()
	if !(hi > 0) || f(0) >= v {
		return 0, 0
	}
	if f(hi) <= v {
		return hi, 0
	}
	lo := 0.0
	for range 100 {
		mid := 0.5 * (lo + hi)
		if mid <= lo || mid >= hi {
			break
		}
		if f(mid) <= v {
			lo = mid
		} else {
			hi = mid
		}
	}
	h := math.Max(1e-9*lo, 1e-12)
	if df := f(lo+h) - f(lo); df > 0 {
		return lo, h / df
	}
	return lo, 0
}
