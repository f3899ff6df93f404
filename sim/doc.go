// Package sim is Switchyard's deterministic discrete-event simulator of an LLM
// inference fleet. It runs several routing policies — round-robin, random,
// nearest, capacity-proportional, power-of-two-choices, prefix-affinity, an
// early feedback loop, and Switchyard itself — on the same arrivals and
// measures what each achieves: TTFT, TBT and end-to-end latency percentiles,
// goodput under an SLO, KV-cache hit rate, shed and cross-region shares,
// engine utilisation and the oscillation of traffic shares. It also computes
// the fluid lower bound: the optimizer's objective with the engines' true
// latency-versus-load curves, measured by simulating each engine alone.
//
// # Model
//
// Time is simulated in milliseconds with an event heap; ties are broken by
// insertion order, and every random draw of one policy run comes from one
// generator seeded by the scenario's seed, so a run is a pure function of the
// scenario, the arrivals and the seed.
//
// Engines run the continuous-batching step model of package batching, the
// one the engine simulator (services/enginesim) runs in real time: at each
// step boundary queued requests are admitted in arrival order while the
// batch has room (MaxBatch) and the KV cache can hold them; admitted requests
// are prefilled together in one step lasting Σ uncached prompt tokens ×
// PrefillMsPerToken, during which decoding pauses; otherwise one decode step
// gives every running request a token and lasts TBTBaseMs +
// TBTPerRequestMs·(b−1) + TBTPerKTokenMs·(context tokens in the batch)/1000.
// A capacity factor divides every duration.
//
// The KV cache holds a fixed number of 512-token blocks. A request pins its
// prompt blocks (named by the trace's hash ids, or by its session) and
// reserves anonymous blocks for its output while it runs; finished prompt
// blocks stay cached and are evicted least-recently-used when room is needed.
// The leading prompt blocks already cached are a prefix hit and cost no
// prefill (the last prompt token is always computed).
//
// The network matrix gives one-way latency in ms from each frontend cluster to
// each engine; a request pays it on the way in and its tokens on the way back,
// so TTFT and end-to-end latency include the round trip.
//
// # Signals and control
//
// Every SignalPeriod each engine publishes what it measured (requests
// arrived, completed, their TTFT, TBT and output tokens, queue and batch
// sizes, capacity and health). An aggregator folds them into EWMA windows
// with the aggregator's own messages.Smoother and default half-lives (1 s
// and 30 s), and the frontend routers' demand likewise. Policies that need signals see only
// these lagged values, plus what each router knows by itself (its own
// in-flight requests, and engines that refused it).
//
// The switchyard policy runs the shipped code: every ControlPeriod the plan
// builder (package plan, as services/optimizersvc runs it) turns engine and
// demand states built from the signals into the optimizer's problem, the
// optimizer solves it warm-started (sharing any shed among the clusters
// with optimizer.ShareShed, as the service does by default), and each
// cluster's weight snapshot is
// installed when it moved by the solver's dead band. Each cluster's router
// runs the router's own guards on the run's virtual clock (guards.go): the
// live set (down marks, in-flight counts, the load from signals,
// ejection), admission (the snapshot's shed fractions by key and class, the
// allotments), the retry budget and the retry's next engine; a request is
// picked with Table.PickRecent and the router's RecentKeys when it has an
// affinity key (session, else the hash of its first prompt blocks), else
// with Table.PickTwo on a spread key and Bound.Overflow past a full batch.
package sim
