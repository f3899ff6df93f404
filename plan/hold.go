package plan

import (
	"math"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// DefaultDemandBandSD is the half-width of the demand hold's band in
// standard deviations of the fast demand window: a Gaussian estimate
// leaves ±3σ about once in 370 independent readings, and the fast window
// decorrelates in a few seconds, so noise alone moves the held demand
// about once in ten minutes, while a change of the rate by more than three
// of the window's standard deviations is followed at the first solve that
// sees it.
const DefaultDemandBandSD = 3.0

// settleHalfLives is how many half-lives of the fast window the held
// demand follows it after it left the band: an exponentially weighted
// window has covered 1-2^-4 = 94% of a step after four.
const settleHalfLives = 4

// DemandHold holds the demand each cluster is planned for while the
// cluster's fast demand window (messages.DemandState.RPS.Fast) stays within
// what that window's own noise explains, so that the plan does not follow
// the noise of a one-second window from one solve to the next.
//
// Per cluster it keeps a held rate H. A fast reading x further than BandSD
// standard deviations of the fast window from H is a change of the rate,
// and H becomes x at once and follows the window while it settles, for
// four of its half-lives (by then it has covered 94% of a step); a
// reading within the band moves H towards x
// with the half-life TrackHalfLife, so that the plan follows a change
// smaller than the band as the slow window would. The standard deviation
// of the fast window is that of an exponentially weighted average of
// half-life h over a rate whose variance over one second is V:
// √(V·ln2/(2h)), V being the cluster's measured variance
// (messages.DemandState.RPSVar, slow window) and at least Poisson's λ:
// the measured window starts at 0 and rises with the slow half-life, so it
// reads low for the first minutes, and requests from many independent
// clients arrive at least as irregularly as a Poisson process. That counts
// the seconds of one burst as independent; demand that comes in bursts
// lasting several seconds spreads the window wider, so the band's standard
// deviation is the larger of that and the measured spread of the fast
// readings about H (over TrackHalfLife, a reading past the band counted at
// its edge, the settling readings not at all).
//
// Keys are the caller's (a model's cluster); Hold is called once per key
// and solve with the solve's time, and Sweep after each round forgets the
// keys not planned in it. The zero value is ready to use with the
// defaults. A DemandHold is not safe for concurrent use.
type DemandHold struct {
	// BandSD is the band's half-width in standard deviations of the fast
	// window; 0 means DefaultDemandBandSD, negative disables the hold.
	BandSD float64
	// FastHalfLife is the half-life of the fast demand window the
	// aggregator keeps; 0 means messages.DefaultFastHalfLife.
	FastHalfLife time.Duration
	// TrackHalfLife is the half-life with which the held demand follows
	// readings within the band; 0 means messages.DefaultSlowHalfLife, the
	// window demand estimates are built on so as not to chase one burst.
	TrackHalfLife time.Duration

	held  map[string]*heldDemand
	round uint64
}

type heldDemand struct {
	rps   float64 // the held total rate, req/s
	dev2  float64 // weighted sum of the squared distances of the fast readings from the held rate
	norm  float64 // the weights summed into dev2, so that dev2/norm is their bias-corrected mean
	span  float64 // seconds of readings averaged into rps since it was last set to a reading
	ms    int64   // time of the last update, Unix ms
	moved int64   // when the window last left the band, Unix ms
	round uint64  // the last round the key was planned in
}

// Hold returns the demand to plan cluster key for at nowMs (Unix ms): d
// itself when the hold is disabled, d is nil or the key is new, else a
// copy of d whose fast rates (in total and by priority class, in
// proportion) are the held rate.
func (h *DemandHold) Hold(key string, d *messages.DemandState, nowMs int64) *messages.DemandState {
	band := h.BandSD
	if band == 0 {
		band = DefaultDemandBandSD
	}
	if band < 0 || d == nil {
		return d
	}
	x := fastTotal(d)
	if !(x > 0) || math.IsInf(x, 0) {
		return d
	}
	if h.held == nil {
		h.held = map[string]*heldDemand{}
	}
	s := h.held[key]
	if s == nil {
		h.held[key] = &heldDemand{rps: x, span: seconds(h.FastHalfLife, messages.DefaultFastHalfLife), ms: nowMs, moved: math.MinInt64 / 2, round: h.round}
		return d
	}
	s.round = h.round
	fastHL := seconds(h.FastHalfLife, messages.DefaultFastHalfLife)
	dev, edge := x-s.rps, band*h.fastSD(d, x, s)
	dt := float64(nowMs-s.ms) / 1000
	switch {
	case float64(nowMs-s.moved)/1000 < settleHalfLives*fastHL:
		// The window is still settling after a change: follow it, so that
		// a step is followed to its end rather than held where it first
		// left the band. Its readings say nothing of the noise.
		s.rps, s.span = x, fastHL
	case math.Abs(dev) > edge:
		s.observe(edge, dt, h.TrackHalfLife)
		s.rps, s.span, s.moved = x, fastHL, nowMs
	default:
		s.observe(dev, dt, h.TrackHalfLife)
		if dt > 0 {
			// The mean of the readings since the held rate was last set
			// to one (that reading standing for a fast half-life of
			// arrivals), until the tracking window weighs a reading more:
			// an average started then, bias-corrected, so that a rate set
			// from one noisy reading (or a settling window's last, 94% of
			// the way) is corrected within seconds instead of over the
			// tracking half-life — a plan held a few percent under a steady
			// demand loads its engines beyond what the plan says.
			s.span += dt
			w := max(1-messages.Retained(dt, seconds(h.TrackHalfLife, messages.DefaultSlowHalfLife)), dt/s.span)
			s.rps += w * dev
		}
	}
	s.ms = max(s.ms, nowMs)
	return scaleFast(d, s.rps/x)
}

// Sweep ends a round of Hold calls: keys not held in it are forgotten.
func (h *DemandHold) Sweep() {
	for k, s := range h.held {
		if s.round != h.round {
			delete(h.held, k)
		}
	}
	h.round++
}

// Held returns the rate held for key and whether one is.
func (h *DemandHold) Held(key string) (float64, bool) {
	if s := h.held[key]; s != nil {
		return s.rps, true
	}
	return 0, false
}

// fastSD is the standard deviation of d's fast window at rate x: the
// larger of what the variance over one second implies for independent
// seconds and the spread of the fast readings about the held rate measured
// in s (readings before this one), which is larger when arrivals come in
// bursts that span several seconds.
func (h *DemandHold) fastSD(d *messages.DemandState, x float64, s *heldDemand) float64 {
	v := x
	if d.RPSVar.Slow > v && !math.IsInf(d.RPSVar.Slow, 0) {
		v = d.RPSVar.Slow
	}
	v *= math.Ln2 / (2 * seconds(h.FastHalfLife, messages.DefaultFastHalfLife))
	if s.norm > 0 {
		v = max(v, s.dev2/s.norm)
	}
	return math.Sqrt(v)
}

// observe folds one reading's distance dev from the held rate into the
// measured spread of the fast window, dt seconds after the previous
// reading, weighted over the tracking half-life hl. A reading that left the
// band counts as at its edge (winsorised): a burst widens the band it is
// measured by only as far as the band's edge, and a real change of the
// rate, which the band is there to detect, counts as no more than one such
// burst.
func (s *heldDemand) observe(dev, dt float64, hl time.Duration) {
	if !(dt > 0) {
		return
	}
	r := messages.Retained(dt, seconds(hl, messages.DefaultSlowHalfLife))
	s.dev2 = r*s.dev2 + (1-r)*dev*dev
	s.norm = r*s.norm + (1 - r)
}

// fastTotal is the fast total rate Demand plans d for (before the least
// demand): the sum of its classes when it has them.
func fastTotal(d *messages.DemandState) float64 {
	if len(d.RPSByPriority) > 0 {
		return d.RPSByPriority[messages.PriorityCritical].Fast + d.RPSByPriority[messages.PriorityStandard].Fast +
			d.RPSByPriority[messages.PrioritySheddable].Fast
	}
	return d.RPS.Fast
}

// scaleFast returns a copy of d with its fast rates multiplied by f.
func scaleFast(d *messages.DemandState, f float64) *messages.DemandState {
	c := *d
	c.RPS.Fast *= f
	if len(d.RPSByPriority) > 0 {
		c.RPSByPriority = make(map[string]messages.Window, len(d.RPSByPriority))
		for p, w := range d.RPSByPriority {
			w.Fast *= f
			c.RPSByPriority[p] = w
		}
	}
	return &c
}

func seconds(d, def time.Duration) float64 {
	if d <= 0 {
		d = def
	}
	return d.Seconds()
}
