// Package router is Switchyard's data plane: it picks an engine for every
// inference request from the installed weight table of its (model, cluster),
// keeping KV-cache affinity, and forwards the request to that engine.
//
// The pieces that do not depend on NATS live here: the selection table
// (weighted, consistent, bounded-load engine selection), affinity key
// extraction, OpenAI request parsing and error rendering, and the HTTP front
// with its HTTP forwarding transport. The snapshot store and the NATS front
// plug in through the small Tables and Transport interfaces.
package router
