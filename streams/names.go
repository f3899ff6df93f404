package streams

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/switchyard-dev/switchyard/messages"
)

// Names holds the configurable parts of the NATS layout: the subject prefix and
// the stream and bucket names. The zero value is not usable; start from
// DefaultNames.
type Names struct {
	// Prefix is the first token of every subject, "sy" by default.
	Prefix string
	// SignalStream and ReportStream are the JetStream stream names.
	SignalStream string
	ReportStream string
	// KVStream is the stream of engines' KV-cache events (messages.KVEvents).
	KVStream string
	// EnginesBucket, DemandBucket, WeightsBucket and LeasesBucket are the KV bucket names.
	EnginesBucket string
	DemandBucket  string
	WeightsBucket string
	LeasesBucket  string
}

// DefaultNames returns the layout of DESIGN.md.
func DefaultNames() Names {
	return Names{
		Prefix:        "sy",
		SignalStream:  "SY_SIGNALS",
		ReportStream:  "SY_REPORTS",
		KVStream:      "SY_KV",
		EnginesBucket: "sy_engines",
		DemandBucket:  "sy_demand",
		WeightsBucket: "sy_weights",
		LeasesBucket:  "sy_leases",
	}
}

// Validate checks that every name is set and is a single NATS token.
func (n Names) Validate() error {
	for _, f := range []struct{ field, v string }{
		{"Prefix", n.Prefix}, {"SignalStream", n.SignalStream}, {"ReportStream", n.ReportStream}, {"KVStream", n.KVStream},
		{"EnginesBucket", n.EnginesBucket}, {"DemandBucket", n.DemandBucket},
		{"WeightsBucket", n.WeightsBucket}, {"LeasesBucket", n.LeasesBucket},
	} {
		if err := messages.CheckName(f.field, f.v); err != nil {
			return err
		}
	}
	return nil
}

// subject is <kind>.<tokens...> for a subject that carries a model: the
// token at modelAt is a model id, written as messages.ModelToken; the others
// are names (messages.ValidName).
func subject(kind string, modelAt int, tokens ...string) (string, error) {
	var b strings.Builder
	b.WriteString(kind)
	for i, t := range tokens {
		b.WriteByte('.')
		if i == modelAt {
			if err := messages.CheckModelName(t); err != nil {
				return "", err
			}
			b.WriteString(messages.ModelToken(t))
			continue
		}
		if !messages.ValidName(t) {
			return "", fmt.Errorf("%w: %q is not a valid name token (1-%d characters of A-Z a-z 0-9 _ -)", messages.ErrInvalid, t, messages.MaxNameLen)
		}
		b.WriteString(t)
	}
	return b.String(), nil
}

// SignalSubject is the subject an engine publishes its signals on: <prefix>.signal.<model>.<engine>.
func (n Names) SignalSubject(model, engine string) (string, error) {
	return subject(n.Prefix+".signal", 0, model, engine)
}

// SignalFilter matches every engine signal.
func (n Names) SignalFilter() string { return n.Prefix + ".signal.>" }

// KVSubject is the subject an engine's KV-cache events are published on:
// <prefix>.kv.<model>.<engine>.
func (n Names) KVSubject(model, engine string) (string, error) {
	return subject(n.Prefix+".kv", 0, model, engine)
}

// KVFilter matches every engine's KV-cache events.
func (n Names) KVFilter() string { return n.Prefix + ".kv.>" }

// ReportSubject is the subject a router publishes its reports on:
// <prefix>.report.<model>.<cluster>.<router>.
func (n Names) ReportSubject(model, cluster, router string) (string, error) {
	return subject(n.Prefix+".report", 0, model, cluster, router)
}

// ReportFilter matches every router report.
func (n Names) ReportFilter() string { return n.Prefix + ".report.>" }

// RequestSubject is the subject the routers of a frontend cluster take
// requests on over NATS: <prefix>.req.<cluster>.<model>.
func (n Names) RequestSubject(cluster, model string) (string, error) {
	return subject(n.Prefix+".req", 1, cluster, model)
}

// RequestQueue is the queue group the routers of a frontend cluster share
// on its request subjects, so that each request reaches one of them.
func RequestQueue(cluster string) string { return "sy-router-" + cluster }

// InferSubject is the subject an engine takes inference requests on over NATS:
// <prefix>.infer.<model>.<engine>.
func (n Names) InferSubject(model, engine string) (string, error) {
	return subject(n.Prefix+".infer", 0, model, engine)
}

// The KV key layout. Model-keyed records (engine state, demand, weights) are
// <model>.<name>, where <model> is the model id's token
// (messages.ModelToken, as in every subject); the records that share the
// buckets with them are led by a reserved word that no model token is (the
// token escapes it), so the two never collide:
//
//	sy_engines  <model>.<engine>            engine state
//	            penalty.<model>.<engine>    penalty record
//	            operator.<engine>           operator override
//	sy_demand   <model>.<cluster>           demand
//	            rtt.<cluster>.<engine>      RTT from a cluster to an engine
//	sy_weights  <model>.<cluster>           weights snapshot
//
// The builders without a Join prefix validate their tokens and are for names
// from outside (flags, configuration, the wire before validation). The Join
// builders only concatenate: they are for names taken from messages that were
// validated on decode, on paths that build a key per message.
const (
	// RTTPrefix leads the sy_demand keys of RTT records.
	RTTPrefix = "rtt."
	// PenaltyPrefix leads the sy_engines keys of penalty records.
	PenaltyPrefix = "penalty."
	// OperatorPrefix leads the sy_engines keys of operator overrides.
	OperatorPrefix = "operator."
)

// JoinKey is <model>.<name>, the key of a model-keyed record (engine state,
// demand, weights) and the in-memory key of the services' per-engine and
// per-cluster maps, for a model id and a name already validated: it writes
// the model's token (messages.ModelToken; no allocation but the
// concatenation when the id is a name) and does not check them. Use
// EngineKey, DemandKey or WeightsKey for names from outside.
func JoinKey(model, name string) string { return messages.ModelToken(model) + "." + name }

// JoinNames is <a>.<b> for two names (cluster and engine), as the RTT keys
// carry them after their prefix.
func JoinNames(a, b string) string { return a + "." + b }

// JoinRTTKey is rtt.<cluster>.<engine> for tokens already validated; RTTKey
// checks them.
func JoinRTTKey(cluster, engine string) string { return RTTPrefix + cluster + "." + engine }

// JoinOperatorKey is operator.<engine> for an engine name already validated;
// OperatorKey checks it.
func JoinOperatorKey(engine string) string { return OperatorPrefix + engine }

// CutRTTKey reports whether key has the shape of an RTT key (rtt.<a>.<b>) and
// returns what follows the prefix, <cluster>.<engine>, for SplitKey. It does
// not validate the tokens.
func CutRTTKey(key string) (rest string, ok bool) {
	rest, ok = strings.CutPrefix(key, RTTPrefix)
	return rest, ok && strings.Count(rest, ".") == 1
}

// IsOperatorKey reports whether key has the shape of an operator override's
// key (operator.<engine>). It does not validate the engine name.
func IsOperatorKey(key string) bool {
	rest, ok := strings.CutPrefix(key, OperatorPrefix)
	return ok && !strings.Contains(rest, ".")
}

// EngineKey is the sy_engines key of an engine's state: <model>.<engine>.
func EngineKey(model, engine string) (string, error) { return modelKey(model, engine) }

// DemandKey is the sy_demand key of a cluster's demand: <model>.<cluster>.
func DemandKey(model, cluster string) (string, error) { return modelKey(model, cluster) }

// RTTKey is the sy_demand key of the RTT from a cluster to an engine: rtt.<cluster>.<engine>.
func RTTKey(cluster, engine string) (string, error) {
	for _, t := range []string{cluster, engine} {
		if !messages.ValidName(t) {
			return "", fmt.Errorf("%w: %q is not a valid name token (1-%d characters of A-Z a-z 0-9 _ -)", messages.ErrInvalid, t, messages.MaxNameLen)
		}
	}
	return RTTPrefix + cluster + "." + engine, nil
}

// PenaltyKey is the sy_engines key of an engine's penalty record:
// penalty.<model>.<engine>.
func PenaltyKey(model, engine string) (string, error) {
	if err := messages.CheckModelName(model); err != nil {
		return "", err
	}
	if err := messages.CheckName("engine", engine); err != nil {
		return "", err
	}
	return PenaltyPrefix + JoinKey(model, engine), nil
}

// OperatorKey is the sy_engines key of an operator override: operator.<engine>.
func OperatorKey(engine string) (string, error) {
	if err := messages.CheckName("engine", engine); err != nil {
		return "", err
	}
	return JoinOperatorKey(engine), nil
}

// WeightsKey is the sy_weights key of a snapshot: <model>.<cluster>.
func WeightsKey(model, cluster string) (string, error) { return modelKey(model, cluster) }

// modelKey is <model token>.<name> after checking both.
func modelKey(model, name string) (string, error) {
	if err := messages.CheckModelName(model); err != nil {
		return "", err
	}
	if !messages.ValidName(name) {
		return "", fmt.Errorf("%w: %q is not a valid name token (1-%d characters of A-Z a-z 0-9 _ -)", messages.ErrInvalid, name, messages.MaxNameLen)
	}
	return JoinKey(model, name), nil
}

// CutKey splits a key built by JoinKey into the model id and the name,
// without validating the name (SplitKey does), for keys the caller built
// itself; ok is false when the first token is not a model token.
func CutKey(key string) (model, name string, ok bool) {
	tok, name, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", false
	}
	model, ok = messages.ModelFromToken(tok)
	return model, name, ok
}

// SplitKey splits a model-keyed key such as <model>.<engine> into the model
// id (decoded from its token) and the name, validating both.
func SplitKey(key string) (model, name string, ok bool) {
	model, name, ok = CutKey(key)
	if !ok || !messages.ValidName(name) {
		return "", "", false
	}
	return model, name, true
}

// SplitNames splits a key of two names, <cluster>.<engine> (what follows an
// RTT key's prefix), validating both.
func SplitNames(key string) (a, b string, ok bool) {
	a, b, ok = strings.Cut(key, ".")
	if !ok || !messages.ValidName(a) || !messages.ValidName(b) {
		return "", "", false
	}
	return a, b, true
}

// ParseSubject splits a subject under prefix and kind (for example "sy" and
// "signal") into its remaining want tokens, validating each, and gives the
// model token as the model id it stands for (messages.ModelFromToken): the
// first token, or the second for "req" (<prefix>.req.<cluster>.<model>).
func (n Names) ParseSubject(subject, kind string, want int) ([]string, bool) {
	rest, ok := strings.CutPrefix(subject, n.Prefix+"."+kind+".")
	if !ok {
		return nil, false
	}
	toks := strings.Split(rest, ".")
	if len(toks) != want {
		return nil, false
	}
	modelAt := 0
	if kind == "req" {
		modelAt = 1
	}
	for i, t := range toks {
		if i == modelAt {
			if toks[i], ok = messages.ModelFromToken(t); !ok {
				return nil, false
			}
			continue
		}
		if !messages.ValidName(t) {
			return nil, false
		}
	}
	return toks, true
}

// MsgIDPrefix returns "<name>-<random>-", the start of the Nats-Msg-Ids
// of one publisher, followed by its sequence number. JetStream
// de-duplicates across the whole stream, not per subject: with a random
// part no other identity that may publish into the same stream can guess
// and pre-send the publisher's next ids to have its real messages
// discarded as duplicates (an identity that could read them is the
// aggregator or an operator, which may not publish there).
func MsgIDPrefix(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return name + "-" + hex.EncodeToString(b[:]) + "-"
}
