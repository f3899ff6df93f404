// Package dashboard serves Switchyard's live dashboard: a single page, plain
// HTML, CSS and JavaScript embedded in the binary (no npm, no CDN, no
// external fonts), that shows what the control plane is doing right now.
//
// A Dashboard watches three KV buckets with JetStream watchers:
//
//   - sy_weights: the newest weight snapshot per (model, frontend cluster);
//   - sy_engines: the aggregator's state of every engine (status, health,
//     capacity, load, queue, TTFT, ...);
//   - sy_demand: the aggregator's demand per (model, cluster), with the shed
//     and retry rates and each reporting router (rtt.* keys are ignored).
//
// It keeps the newest value of every key, and once per SampleInterval it
// appends a sample (every weight and every engine's load and effective
// capacity) to a ring that covers History. Watchers are re-created with
// backoff when they fail, when the bucket does not exist yet, and after
// every NATS reconnect; keys deleted while a watcher was down are dropped
// when the new watcher has delivered the bucket's current values.
//
// Handler serves:
//
//	GET /              the page (index.html, app.js, style.css)
//	GET /api/state     the current state as JSON (see State)
//	GET /api/history   the samples as JSON (see History); ?since=<unix ms>
//	                   returns only newer samples
//
// The page polls /api/state every second and /api/history every few
// seconds, and draws the weights matrix (frontend clusters × engines, each
// cell shaded by its weight and carrying data-model, data-cluster,
// data-engine and data-weight attributes, the weight formatted with four
// decimals), engine cards (load against effective capacity, health,
// status, queue, TTFT), per-cluster demand, shed and retry rates, each
// router's snapshot generation, age and mode, and canvas charts of the
// weights and of engine load over the History window.
//
// Router status comes from Options.Routers when the process runs routers
// itself (switchyard up passes RouterStatuses(stack.Routers)); in every
// deployment the page also lists the routers that report into sy_demand,
// with the age of their newest report.
package dashboard
