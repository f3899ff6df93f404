// Package livecheck is the live check behind `switchyard sim --live`: one small
// scenario run twice on the same arrivals, through the real services
// (embedded NATS, aggregator, optimizer service, one router per cluster and
// simulated engines, all in this process, load over real HTTP) and through
// the simulator's switchyard policy, compared row by row, so that the
// simulator stays honest about the real system. See docs/simulation.md.
//
// It lives apart from sim so that the discrete-event simulator links only
// the pure parts it models (optimizer, router selection, workload), not the
// stack and the services.
package livecheck
