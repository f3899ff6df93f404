// Package natsembed runs a NATS server (with JetStream) inside the process:
// the server of `switchyard up` and `switchyard nats`, the leaf node a
// router can embed, and the servers and clusters the tests start.
//
// It is the only package of Switchyard that links nats-server. It lives
// apart from streams so that what only connects to NATS — the engine SDK a
// Go engine embeds, the router, the aggregator, the engine simulator —
// reads the NATS layout from streams without linking a server.
package natsembed
