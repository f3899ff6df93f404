// Package scenario is the simulator's input: the scenario file (the fleet,
// the frontend clusters and their arrivals, the network, timed events, the
// SLO and the policies' options), read strictly from YAML and validated
// field by field, and the arrivals it generates or replays from a trace
// (through workload), shared read-only by every policy run.
package scenario
