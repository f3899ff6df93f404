//go:build !race

package router

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
