package aggregator

import (
	"math"

	"github.com/switchyard-dev/switchyard/messages"
)

// Smoother folds samples into a messages.Window with two half-lives. Samples
// may arrive at irregular intervals: the weight of a sample grows with the time
// since the previous one, so that the half-life is in wall time, not samples.
type Smoother struct {
	// Fast and Slow are the half-lives in seconds.
	Fast, Slow float64
}

// decay returns the weight of the new sample after dt seconds, for half-life h.
func decay(dt, h float64) float64 {
	if h <= 0 {
		return 1
	}
	if dt <= 0 {
		// Same timestamp: average in with a small weight rather than not at all.
		dt = 1e-3
	}
	return 1 - math.Exp(-dt*math.Ln2/h)
}

// Update folds value v observed dt seconds after the previous sample into w.
// When first is true, w is set to v.
func (s Smoother) Update(w *messages.Window, v, dt float64, first bool) {
	if first {
		w.Fast, w.Slow = v, v
		return
	}
	w.Fast += decay(dt, s.Fast) * (v - w.Fast)
	w.Slow += decay(dt, s.Slow) * (v - w.Slow)
}
