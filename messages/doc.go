// Package messages defines Switchyard's wire types: the engine signal, the
// router report, the aggregated engine and demand state, the RTT state and the
// weight snapshot.
//
// Every message is MessagePack encoded as a map with short string keys, carries
// the schema version under "v" and its kind under "k", so that an engine in any
// language can publish one with any msgpack library and any Switchyard tool can
// tell what it holds. Decoding is strict: unknown keys, a wrong schema version,
// NaN or infinite numbers, negative rates, fractions outside 0..1, names that
// are not NATS tokens, timestamps far in the future and oversize payloads are
// all rejected with an error that names the field and the value.
package messages
