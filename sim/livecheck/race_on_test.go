//go:build race

package livecheck

// raceEnabled reports whether the tests run under the race detector, which
// slows the live stack several times over and makes timing comparisons
// meaningless.
const raceEnabled = true
