// Package testenv builds in-process Switchyard stacks for tests, benchmarks and
// simulation: embedded NATS servers on random ports in temporary directories,
// connected clients, and condition polling.
package testenv
