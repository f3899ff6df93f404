// Package streams holds Switchyard's NATS layout: subject builders, the stream
// and KV bucket definitions and their idempotent provisioning, connecting with
// reconnect-forever, and a bucket watch that survives NATS trouble. The
// embedded NATS server is in streams/natsembed, so that a program that only
// connects to NATS does not link nats-server.
package streams
