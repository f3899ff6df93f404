//go:build race

package router

// raceEnabled reports whether the tests run under the race detector, which
// slows every request several times over; timing bounds widen with it.
const raceEnabled = true
