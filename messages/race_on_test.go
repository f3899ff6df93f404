//go:build race

package messages

// raceEnabled is true under the race detector, whose instrumentation
// allocates on its own, so allocation bounds are only logged.
const raceEnabled = true
