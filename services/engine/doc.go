// Package engine is the engine-side SDK of Switchyard: what an inference engine
// written in Go embeds to take part in the signal path, and the conventions of
// the NATS inference protocol that engines and routers share.
//
// A Publisher publishes the engine's signal (messages.EngineSignal) to
// JetStream on <prefix>.signal.<model>.<engine> every interval (200 ms by
// default). Each signal carries a sequence number that rises by one per signal
// and the header Nats-Msg-Id "<engine>-<random>-<seq>", so that the SY_SIGNALS
// stream drops duplicates within its dedup window, and no other publisher
// can guess the next ids (streams.MsgIDPrefix). While NATS is unreachable the
// Publisher queues nothing: it keeps owing one signal and, as soon as the
// connection is back, publishes the newest values once.
//
// Signals go to JetStream only. A plain core-NATS subscription on the same
// subject also receives every JetStream-published signal, which is how
// routers watch engines for their fast local guard.
//
// Over NATS request-reply (<prefix>.infer.<model>.<engine>), an engine answers
// an OpenAI-style JSON request with one or more reply messages; every reply
// carries HeaderStatus, and the last one carries HeaderLast. See
// docs/engine-integration.md.
package engine
