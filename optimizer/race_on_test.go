//go:build race

package optimizer

// raceEnabled reports whether the tests run under the race detector, which multiplies the
// CPU cost of this single-goroutine numerical code: the slowest tests run smaller or fewer
// instances under it and their full sizes without it.
const raceEnabled = true
