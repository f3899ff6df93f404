// Package router is Switchyard's data plane: it picks an engine for every
// inference request from the installed weight table of its (model, cluster),
// keeping KV-cache affinity, and forwards the request to that engine.
//
// The pure pieces are packages of their own: the selection table
// (router/selection: weighted, consistent, bounded-load engine selection),
// OpenAI request parsing, affinity keys and error rendering
// (router/protocol), the guards' rules (router/guard) and the live guard
// (router/live). The HTTP front (router/httpfront, through the narrow
// httpfront.Pipeline that NewServer makes of a Handler) and the NATS front
// (router/natsfront, through the natsfront.Pipeline that Handler
// implements) share one request pipeline (Handler.begin) and plug into the
// rest through the control.Tables, upstream.Transport and control.Observer
// interfaces.
//
// A Service wires one router together:
//
//   - control.SnapshotStore (Tables) watches sy_weights keys *.<cluster>,
//     decodes strictly, installs a snapshot only if its generation is
//     newer, and publishes immutable per-model tables through an atomic
//     pointer, so a request never waits on NATS. A snapshot's own slot
//     table (computed by the optimizer with selection.AssignSlots) is
//     installed as is (selection.NewTableFromSlots), so every router maps
//     keys alike and weight changes move the fewest keys; snapshots
//     without one get selection.NewTable's. A model with no snapshot, or
//     one older than StaleAfter, routes by the local policy: engines that
//     live signals show healthy, weighted by capacity_rps. The watcher is
//     re-created after errors and after every NATS reconnect.
//   - control.Signals subscribes (core NATS) to engine signals: it marks
//     engines down when they report health 0 or fall silent for DownAfter
//     while NATS is connected (silence during an outage is not held
//     against them), and it knows each engine's advertised endpoints.
//   - upstream.TransportPolicy forwards over HTTP when the engine
//     advertises a URL, else over NATS request-reply
//     (upstream.NATSTransport); PreferNATS reverses it.
//     upstream.HTTPTransport speaks HTTP/1.1 to plain-http engines with its
//     own client: per-engine keep-alive pools, the request written and the
//     response read in the handler's goroutine (no per-connection
//     goroutines), a cancelled request closing its connection.
//   - control.Reporter counts requests and per-engine outcomes and
//     publishes a messages.RouterReport per model every interval, with RTT
//     probes.
package router
