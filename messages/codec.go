package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Size limits: a message larger than its limit is rejected before decoding.
const (
	// MaxMessageSize bounds signals, reports and state messages.
	MaxMessageSize = 64 << 10
	// MaxSnapshotSize bounds weight snapshots, which list up to thousands of engines.
	MaxSnapshotSize = 1 << 20
	// MaxFutureSkew is how far in the future a timestamp may be before it is rejected.
	MaxFutureSkew = time.Minute
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrDecode means the bytes are not a well-formed Switchyard message.
	ErrDecode = errors.New("messages: malformed message")
	// ErrVersion means the message carries a schema version this package does not accept.
	ErrVersion = errors.New("messages: unsupported schema version")
	// ErrInvalid means the message decoded but a field failed validation.
	ErrInvalid = errors.New("messages: invalid field")
	// ErrTooLarge means the payload exceeds the size limit for its kind.
	ErrTooLarge = errors.New("messages: payload too large")
	// ErrKind means the message is of another kind than the one asked for, or of no known kind.
	ErrKind = errors.New("messages: unknown or unexpected kind")
)

// Message is implemented by every wire type.
type Message interface {
	// MessageKind returns the kind the message must carry.
	MessageKind() Kind
	// Validate checks every field; now bounds how far in the future timestamps may lie.
	Validate(now time.Time) error
	// stamp sets the schema version and kind before encoding.
	stamp()
	// header returns the schema version and kind the message carries.
	header() (int, Kind)
}

// MessageKind returns KindSignal.
func (*EngineSignal) MessageKind() Kind { return KindSignal }

// MessageKind returns KindReport.
func (*RouterReport) MessageKind() Kind { return KindReport }

// MessageKind returns KindEngineState.
func (*EngineState) MessageKind() Kind { return KindEngineState }

// MessageKind returns KindDemandState.
func (*DemandState) MessageKind() Kind { return KindDemandState }

// MessageKind returns KindRTTState.
func (*RTTState) MessageKind() Kind { return KindRTTState }

// MessageKind returns KindWeights.
func (*WeightSnapshot) MessageKind() Kind { return KindWeights }

// MessageKind returns KindPenalty.
func (*Penalty) MessageKind() Kind { return KindPenalty }

// MessageKind returns KindOperator.
func (*Operator) MessageKind() Kind { return KindOperator }

func (m *EngineSignal) stamp()   { m.Version, m.Kind = SchemaVersion, KindSignal }
func (m *RouterReport) stamp()   { m.Version, m.Kind = SchemaVersion, KindReport }
func (m *EngineState) stamp()    { m.Version, m.Kind = SchemaVersion, KindEngineState }
func (m *DemandState) stamp()    { m.Version, m.Kind = SchemaVersion, KindDemandState }
func (m *RTTState) stamp()       { m.Version, m.Kind = SchemaVersion, KindRTTState }
func (m *WeightSnapshot) stamp() { m.Version, m.Kind = SchemaVersion, KindWeights }
func (m *Penalty) stamp()        { m.Version, m.Kind = SchemaVersion, KindPenalty }
func (m *Operator) stamp()       { m.Version, m.Kind = SchemaVersion, KindOperator }

func (m *EngineSignal) header() (int, Kind)   { return m.Version, m.Kind }
func (m *RouterReport) header() (int, Kind)   { return m.Version, m.Kind }
func (m *EngineState) header() (int, Kind)    { return m.Version, m.Kind }
func (m *DemandState) header() (int, Kind)    { return m.Version, m.Kind }
func (m *RTTState) header() (int, Kind)       { return m.Version, m.Kind }
func (m *WeightSnapshot) header() (int, Kind) { return m.Version, m.Kind }
func (m *Penalty) header() (int, Kind)        { return m.Version, m.Kind }
func (m *Operator) header() (int, Kind)       { return m.Version, m.Kind }

// New returns a new empty message of kind k.
func New(k Kind) (Message, error) {
	switch k {
	case KindSignal:
		return new(EngineSignal), nil
	case KindReport:
		return new(RouterReport), nil
	case KindEngineState:
		return new(EngineState), nil
	case KindDemandState:
		return new(DemandState), nil
	case KindRTTState:
		return new(RTTState), nil
	case KindWeights:
		return new(WeightSnapshot), nil
	case KindPenalty:
		return new(Penalty), nil
	case KindOperator:
		return new(Operator), nil
	case KindKVEvents:
		return new(KVEvents), nil
	}
	return nil, fmt.Errorf("%w: %q", ErrKind, k)
}

// KindByName resolves a kind from its name or a short alias used on the command
// line: "signal", "report", "engine_state" or "engine", "demand_state" or
// "demand", "rtt_state" or "rtt", "weights" or "snapshot", "penalty",
// "operator", "kv_events" or "kv".
func KindByName(name string) (Kind, error) {
	switch name {
	case "signal", "report", "engine_state", "demand_state", "rtt_state", "weights", "penalty", "operator", "kv_events":
		return Kind(name), nil
	case "kv":
		return KindKVEvents, nil
	case "engine":
		return KindEngineState, nil
	case "demand":
		return KindDemandState, nil
	case "rtt":
		return KindRTTState, nil
	case "snapshot":
		return KindWeights, nil
	}
	return "", fmt.Errorf("%w: %q (want signal, report, engine_state, demand_state, rtt_state, weights, penalty, operator or kv_events)", ErrKind, name)
}

func checkSize(data []byte, k Kind) error {
	if limit := sizeLimit(k); len(data) > limit {
		return fmt.Errorf("%w: %s of %d bytes (limit %d)", ErrTooLarge, k, len(data), limit)
	}
	return nil
}

func sizeLimit(k Kind) int {
	if k == KindWeights {
		return MaxSnapshotSize
	}
	return MaxMessageSize
}

// Encode stamps m with the schema version and its kind, validates it, and
// returns its MessagePack encoding.
func Encode(m Message) ([]byte, error) {
	return EncodeAt(m, time.Now())
}

// EncodeAt is Encode with an explicit clock for timestamp validation.
func EncodeAt(m Message, now time.Time) ([]byte, error) {
	m.stamp()
	if err := m.Validate(now); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("messages: encode %s: %w", m.MessageKind(), err)
	}
	if buf.Len() > sizeLimit(m.MessageKind()) {
		return nil, fmt.Errorf("%w: %s of %d bytes (limit %d)", ErrTooLarge, m.MessageKind(), buf.Len(), sizeLimit(m.MessageKind()))
	}
	return buf.Bytes(), nil
}

type header struct {
	Version int  `msgpack:"v"`
	Kind    Kind `msgpack:"k"`
}

// Peek returns the schema version and kind of an encoded message without
// decoding the rest.
func Peek(data []byte) (version int, kind Kind, err error) {
	if len(data) > MaxSnapshotSize {
		return 0, "", fmt.Errorf("%w: %d bytes (limit %d)", ErrTooLarge, len(data), MaxSnapshotSize)
	}
	if err := scanMsgpack(data); err != nil {
		return 0, "", err
	}
	return peek(data)
}

// peek is Peek on bytes that scanMsgpack accepted.
func peek(data []byte) (version int, kind Kind, err error) {
	var h header
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&h); err != nil {
		return 0, "", fmt.Errorf("%w: %v", ErrDecode, err)
	}
	return h.Version, h.Kind, nil
}

// Decode decodes and validates any Switchyard message.
func Decode(data []byte) (Message, error) {
	return DecodeAt(data, time.Now())
}

// DecodeAt is Decode with an explicit clock for timestamp validation.
func DecodeAt(data []byte, now time.Time) (Message, error) {
	v, k, err := Peek(data)
	if err != nil {
		return nil, err
	}
	if v != SchemaVersion {
		return nil, fmt.Errorf("%w: v=%d (this build reads v=%d)", ErrVersion, v, SchemaVersion)
	}
	m, err := New(k)
	if err != nil {
		return nil, err
	}
	if err := checkSize(data, k); err != nil {
		return nil, err
	}
	if err := decodeScanned(data, m, now); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeInto decodes data into m, strictly: the kind must be m's, unknown keys
// are rejected, and the result must validate. Before anything is allocated,
// the bytes are checked to be exactly one complete MessagePack value whose
// every length is backed by the bytes that follow (see MaxNesting and
// MaxContainerLen), so no input makes decoding allocate more than a small
// multiple of its size; every decode entry point of this package does so.
func DecodeInto(data []byte, m Message) error {
	return DecodeIntoAt(data, m, time.Now())
}

// DecodeIntoAt is DecodeInto with an explicit clock for timestamp validation.
func DecodeIntoAt(data []byte, m Message, now time.Time) error {
	if err := checkSize(data, m.MessageKind()); err != nil {
		return err
	}
	if err := scanMsgpack(data); err != nil {
		return fmt.Errorf("%s: %w", m.MessageKind(), err)
	}
	return decodeScanned(data, m, now)
}

// decodeScanned is DecodeIntoAt on bytes that scanMsgpack accepted: every
// length in them is backed by the bytes, so the msgpack library's
// preallocations stay within a small multiple of the input.
func decodeScanned(data []byte, m Message, now time.Time) error {
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(m); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrDecode, m.MessageKind(), err)
	}
	if err := checkHeader(m); err != nil {
		return err
	}
	return m.Validate(now)
}

func checkHeader(m Message) error {
	v, k := m.header()
	if v != SchemaVersion {
		return fmt.Errorf("%w: v=%d (this build reads v=%d)", ErrVersion, v, SchemaVersion)
	}
	if k != m.MessageKind() {
		return fmt.Errorf("%w: got %q, want %q", ErrKind, k, m.MessageKind())
	}
	return nil
}

// JSON renders a message as indented JSON, for people and for `switchyard decode`.
func JSON(m Message) ([]byte, error) {
	return json.MarshalIndent(m, "", "  ")
}

// FromJSON parses the JSON rendering of a message of kind k (as produced by
// JSON, with "v" and "k" optional), stamps and validates it.
func FromJSON(k Kind, data []byte, now time.Time) (Message, error) {
	m, err := New(k)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("%w: %s JSON: %v", ErrDecode, k, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s JSON: trailing data after the object", ErrDecode, k)
	}
	if err := checkJSONHeader(m); err != nil {
		return nil, err
	}
	m.stamp()
	if err := m.Validate(now); err != nil {
		return nil, err
	}
	return m, nil
}

func checkJSONHeader(m Message) error {
	v, k := m.header()
	if v != 0 && v != SchemaVersion {
		return fmt.Errorf("%w: v=%d (this build writes v=%d)", ErrVersion, v, SchemaVersion)
	}
	if k != "" && k != m.MessageKind() {
		return fmt.Errorf("%w: JSON says %q, want %q", ErrKind, k, m.MessageKind())
	}
	return nil
}
