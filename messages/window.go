package messages

import (
	"math"
	"time"
)

// Default half-lives of the two windows. The fast window follows a change
// within a few signals (engines signal every 250 ms by default); the slow one
// spans many control periods, so a latency fit and a demand estimate built on
// it do not chase one burst.
const (
	DefaultFastHalfLife = time.Second
	DefaultSlowHalfLife = 30 * time.Second
)

// Smoother folds samples into a Window with two half-lives: the one
// exponentially weighted moving average of Switchyard, kept by the
// aggregator and modelled by the simulator. Samples may arrive at irregular
// intervals: the weight of a sample grows with the time since the previous
// one, so that the half-life is in wall time, not in samples.
type Smoother struct {
	// Fast and Slow are the half-lives in seconds.
	Fast, Slow float64
}

// DefaultSmoother returns the Smoother of DefaultFastHalfLife and DefaultSlowHalfLife.
func DefaultSmoother() Smoother {
	return Smoother{Fast: DefaultFastHalfLife.Seconds(), Slow: DefaultSlowHalfLife.Seconds()}
}

// Retained returns the share of an exponentially decaying quantity of
// half-life h seconds left after dt seconds, 2^(−dt/h); 0 when h ≤ 0.
func Retained(dt, h float64) float64 {
	if h <= 0 {
		return 0
	}
	return math.Exp(-dt * math.Ln2 / h)
}

// weight returns the weight of a new sample dt seconds after the previous
// one, for half-life h.
func weight(dt, h float64) float64 {
	if h <= 0 {
		return 1
	}
	if dt <= 0 {
		// Same timestamp: average in with a small weight rather than not at all.
		dt = 1e-3
	}
	return 1 - Retained(dt, h)
}

// Update folds value v observed dt seconds after the previous sample into w.
// When first is true, w is set to v.
func (s Smoother) Update(w *Window, v, dt float64, first bool) {
	if first {
		w.Fast, w.Slow = v, v
		return
	}
	w.Fast += weight(dt, s.Fast) * (v - w.Fast)
	w.Slow += weight(dt, s.Slow) * (v - w.Slow)
}

// UpdateVariance folds a rate x measured over interval seconds, dt seconds
// after the previous sample, into mean (as Update does), and the squared
// deviation of x from mean's slow window before the update into variance,
// scaled by the interval: the variance of the rate over one second,
// assuming independent increments (a Poisson rate λ measured over an
// interval T varies by λ/T, which counts as λ whatever T is). When first
// is true, mean is set to x and variance to 0.
func (s Smoother) UpdateVariance(mean, variance *Window, x, interval, dt float64, first bool) {
	if first {
		s.Update(mean, x, dt, true)
		s.Update(variance, 0, dt, true)
		return
	}
	d := x - mean.Slow
	s.Update(variance, d*d*max(interval, 0), dt, false)
	s.Update(mean, x, dt, false)
}

// IsZero reports whether both averages are 0: an optional window that was
// never measured, which the encoder omits.
func (w Window) IsZero() bool { return w.Fast == 0 && w.Slow == 0 }
