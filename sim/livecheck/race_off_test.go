//go:build !race

package livecheck

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
