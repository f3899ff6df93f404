// Package streams holds Switchyard's NATS layout: subject builders, the stream
// and KV bucket definitions and their idempotent provisioning, connecting with
// reconnect-forever, a bucket watch that survives NATS trouble, and the
// embedded NATS server that `switchyard up`, `switchyard nats` and the tests
// all use.
package streams
