package enginesim

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/batching"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/engine"
	"github.com/switchyard-dev/switchyard/streams"
)

// Defaults applied by New to zero-valued Options fields.
const (
	DefaultMaxBatch          = 32
	DefaultPrefillMsPerToken = 0.02
	DefaultBaseTBTMs         = 15
	DefaultTBTGrowthMs       = 0.1
	DefaultOutputTokens      = 128
	DefaultPromptTokens      = 256
	DefaultListen            = "127.0.0.1:0"
	DefaultNATSTimeout       = 2 * time.Minute
)

// Options configures a simulated engine; zero values take the defaults above.
type Options struct {
	// Name is the engine name (a NATS token). Required.
	Name string
	// Model is the model id served (messages.ValidModelName: slashes and
	// dots allowed). Required.
	Model string
	// ServedModel is the name the engine answers to in requests' model
	// field when it is not Model, as vLLM's --served-model-name; carried
	// in its signals. Empty: Model.
	ServedModel string
	// Region is the engine's region (optional NATS token).
	Region string

	// MaxBatch is the largest number of requests decoded together.
	MaxBatch int
	// PrefillMsPerToken is the prefill cost per prompt token, ms.
	PrefillMsPerToken float64
	// BaseTBTMs is the time between tokens with one running request, ms.
	BaseTBTMs float64
	// TBTGrowthMs is how much TBT grows per extra running request, ms.
	TBTGrowthMs float64
	// OutputTokens is the number of tokens a request generates unless max_tokens is smaller.
	OutputTokens int
	// PromptTokens is the mean prompt length Capacity assumes, tokens.
	PromptTokens int
	// KVTokens is the KV cache size in tokens; zero means 2 × MaxBatch × (PromptTokens + OutputTokens).
	KVTokens int
	// TimeScale multiplies every modelled duration (0.1 runs ten times faster); zero means 1.
	TimeScale float64

	// Listen is the HTTP listen address.
	Listen string
	// AdminListen, when set, serves /metrics, /healthz and /admin/failure (failure
	// injection, on no other HTTP listener) on a
	// second listener that stays up when the engine is crashed.
	AdminListen string

	// Conn, when set, makes the engine serve NATS inference and publish signals. The caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// NATSQueue, when set, is the queue group of the inference subscription.
	NATSQueue string
	// NATSTimeout bounds one NATS inference request (NATS has no client disconnect).
	NATSTimeout time.Duration
	// SignalInterval is the time between signals; zero means engine.DefaultInterval.
	SignalInterval time.Duration
	// NoSignals turns signal publishing off even when Conn is set (for an
	// engine fronted by `switchyard agent`, which publishes for it).
	NoSignals bool
	// MetricsFormat selects what /metrics serves besides the simulator's own
	// metrics: MetricsVLLM adds vLLM's names, labels and histograms (and the
	// engine answers /health as vLLM does); empty or MetricsSwitchyard adds nothing.
	MetricsFormat string

	// KVEvents, when set, makes the engine keep a prefix cache of its
	// prompts' 16-token blocks (KVTokens of them at most) and publish its
	// changes as vLLM's KV events on a ZMQ PUB socket bound there
	// (tcp://host:port; port 0 picks one, see Engine.KVEndpoint); KVReplay
	// binds vLLM's replay socket too, and KVTopic is the topic frame.
	KVEvents, KVReplay, KVTopic string

	// Failure is the failure injection in force at start.
	Failure Failure
	// Seed seeds the error-rate draws; zero means a random seed.
	Seed uint64
	// Logger receives the engine's log.
	Logger zerolog.Logger
}

// Failure is an injected failure mode; the zero value injects nothing.
type Failure struct {
	// ErrorRate is the fraction of requests answered with status 500, 0..1.
	ErrorRate float64 `json:"error_rate"`
	// AddedLatencyMs delays every request by this many real milliseconds before it queues.
	AddedLatencyMs float64 `json:"added_latency_ms"`
	// Hang makes the engine accept requests and never answer until the client gives up.
	Hang bool `json:"hang"`
	// CrashAfter, when positive, crashes the engine when request CrashAfter+1 arrives,
	// counting from when this Failure was set.
	CrashAfter int `json:"crash_after"`
	// Crashed reports (and, when set, commands) a crashed engine: listener closed,
	// NATS subscription gone, running requests lost. Setting it false recovers.
	Crashed bool `json:"crashed"`
	// CapacityFactor scales the engine's speed and capacity, 0 < f <= 10; zero means 1.
	CapacityFactor float64 `json:"capacity_factor"`
	// Silent keeps the signalled health at 1 whatever is injected.
	Silent bool `json:"silent"`
	// TTFTFactor, when above 1, makes the engine slow to first token: every
	// request waits (TTFTFactor − 1) × its idle-engine TTFT (prefill of its
	// prompt) before it queues, so an idle engine's TTFT is TTFTFactor
	// times the normal one. 0 or 1 means normal; at most 1000.
	TTFTFactor float64 `json:"ttft_factor"`
}

func (f Failure) validate() error {
	switch {
	case math.IsNaN(f.ErrorRate) || f.ErrorRate < 0 || f.ErrorRate > 1:
		return fmt.Errorf("%w: Failure.ErrorRate is %v, want 0..1", ErrOptions, f.ErrorRate)
	case math.IsNaN(f.AddedLatencyMs) || f.AddedLatencyMs < 0 || f.AddedLatencyMs > 3.6e6:
		return fmt.Errorf("%w: Failure.AddedLatencyMs is %v, want 0..3600000", ErrOptions, f.AddedLatencyMs)
	case f.CrashAfter < 0:
		return fmt.Errorf("%w: Failure.CrashAfter is %d, want >= 0", ErrOptions, f.CrashAfter)
	case math.IsNaN(f.TTFTFactor) || f.TTFTFactor < 0 || f.TTFTFactor > 1000:
		return fmt.Errorf("%w: Failure.TTFTFactor is %v, want 0 (meaning 1) or 1 <= k <= 1000", ErrOptions, f.TTFTFactor)
	case math.IsNaN(f.CapacityFactor) || f.CapacityFactor < 0 || f.CapacityFactor > 10:
		return fmt.Errorf("%w: Failure.CapacityFactor is %v, want 0 (meaning 1) or 0 < f <= 10", ErrOptions, f.CapacityFactor)
	}
	return nil
}

func (f Failure) factor() float64 {
	if f.CapacityFactor == 0 {
		return 1
	}
	return f.CapacityFactor
}

// health is the engine's own view: 0 when crashed or hanging, otherwise the
// fraction of requests it answers successfully.
func (f Failure) health() float64 {
	switch {
	case f.Silent:
		return 1
	case f.Crashed, f.Hang:
		return 0
	}
	return 1 - f.ErrorRate
}

// ErrOptions is wrapped by every error of Validate and of New for invalid
// options, and of Engine.SetFailure for an invalid Failure.
var ErrOptions = errors.New("enginesim: invalid options")

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.PrefillMsPerToken == 0 {
		o.PrefillMsPerToken = DefaultPrefillMsPerToken
	}
	if o.BaseTBTMs == 0 {
		o.BaseTBTMs = DefaultBaseTBTMs
	}
	if o.TBTGrowthMs == 0 {
		o.TBTGrowthMs = DefaultTBTGrowthMs
	}
	if o.OutputTokens == 0 {
		o.OutputTokens = DefaultOutputTokens
	}
	if o.PromptTokens == 0 {
		o.PromptTokens = DefaultPromptTokens
	}
	if o.KVTokens == 0 && o.MaxBatch > 0 && o.PromptTokens > 0 && o.OutputTokens > 0 {
		o.KVTokens = 2 * o.MaxBatch * (o.PromptTokens + o.OutputTokens)
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.NATSTimeout == 0 {
		o.NATSTimeout = DefaultNATSTimeout
	}
	if o.SignalInterval == 0 {
		o.SignalInterval = engine.DefaultInterval
	}
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions. Conn is
// optional, so Validate checks everything New does.
func (o Options) Validate() error {
	o = o.WithDefaults()
	for _, c := range []struct {
		field, v string
		optional bool
	}{{"Name", o.Name, false}, {"Region", o.Region, true}} {
		if c.optional && c.v == "" {
			continue
		}
		if err := messages.CheckName(c.field, c.v); err != nil {
			return fmt.Errorf("%w: %v", ErrOptions, err)
		}
	}
	if err := messages.CheckModelName(o.Model); err != nil {
		return fmt.Errorf("%w: Model: %v", ErrOptions, err)
	}
	if o.ServedModel != "" {
		if err := messages.CheckModelName(o.ServedModel); err != nil {
			return fmt.Errorf("%w: ServedModel: %v", ErrOptions, err)
		}
	}
	finitePos := func(field string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			return fmt.Errorf("%w: %s is %v, want a finite number > 0", ErrOptions, field, v)
		}
		return nil
	}
	for _, c := range []struct {
		field string
		v     float64
	}{{"PrefillMsPerToken", o.PrefillMsPerToken}, {"BaseTBTMs", o.BaseTBTMs},
		{"TBTGrowthMs", o.TBTGrowthMs}, {"TimeScale", o.TimeScale}} {
		if err := finitePos(c.field, c.v); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		field string
		v     int
	}{{"MaxBatch", o.MaxBatch}, {"OutputTokens", o.OutputTokens}, {"PromptTokens", o.PromptTokens}, {"KVTokens", o.KVTokens}} {
		if c.v <= 0 {
			return fmt.Errorf("%w: %s is %d, want > 0", ErrOptions, c.field, c.v)
		}
	}
	if o.KVTokens < o.PromptTokens+o.OutputTokens {
		return fmt.Errorf("%w: KVTokens is %d, want at least PromptTokens+OutputTokens = %d", ErrOptions, o.KVTokens, o.PromptTokens+o.OutputTokens)
	}
	if o.NATSTimeout < 0 {
		return fmt.Errorf("%w: NATSTimeout is %s, want >= 0", ErrOptions, o.NATSTimeout)
	}
	if o.SignalInterval < 0 {
		return fmt.Errorf("%w: SignalInterval is %s, want >= 0", ErrOptions, o.SignalInterval)
	}
	if err := o.Names.Validate(); err != nil {
		return fmt.Errorf("%w: Names: %v", ErrOptions, err)
	}
	if o.NATSQueue != "" && !messages.ValidName(o.NATSQueue) {
		return fmt.Errorf("%w: NATSQueue is %q, want a NATS token", ErrOptions, o.NATSQueue)
	}
	for _, ep := range []struct{ field, v string }{{"Options.KVEvents", o.KVEvents}, {"Options.KVReplay", o.KVReplay}} {
		if ep.v != "" && !strings.HasPrefix(ep.v, "tcp://") {
			return fmt.Errorf("enginesim: %s is %q, want tcp://host:port", ep.field, ep.v)
		}
	}
	if o.KVReplay != "" && o.KVEvents == "" {
		return fmt.Errorf("enginesim: Options.KVReplay is %q without Options.KVEvents", o.KVReplay)
	}
	if err := o.Failure.validate(); err != nil {
		return err
	}
	return validMetricsFormat(o.MetricsFormat)
}

// cost returns the step-time model of these options, before scaling.
func (o Options) cost() batching.Cost {
	return batching.Cost{PrefillMsPerToken: o.PrefillMsPerToken, TBTBaseMs: o.BaseTBTMs, TBTPerRequestMs: o.TBTGrowthMs}
}

// effectiveBatch is the batch size the KV cache allows for mean-sized requests.
func (o Options) effectiveBatch() int {
	return max(1, min(o.MaxBatch, o.KVTokens/(o.PromptTokens+o.OutputTokens)))
}

// Capacity returns the sustainable request rate, req/s, of an engine with these
// options (defaults applied) and no failure injected; see the package doc.
func Capacity(o Options) float64 {
	o = o.WithDefaults()
	return capacity(o, 1)
}

func capacity(o Options, factor float64) float64 {
	return o.cost().Capacity(o.effectiveBatch(), o.PromptTokens, o.OutputTokens) * factor / o.TimeScale
}

// BatchForCapacity returns the smallest MaxBatch at which an engine with the
// other options of o (defaults applied, KVTokens grown to fit) reaches rps
// req/s, or an error naming the highest rate the options allow.
func BatchForCapacity(o Options, rps float64) (int, error) {
	if math.IsNaN(rps) || rps <= 0 {
		return 0, fmt.Errorf("enginesim: target capacity %v req/s, want > 0", rps)
	}
	o.KVTokens = 0
	for b := 1; b <= 4096; b++ {
		o.MaxBatch = b
		if Capacity(o) >= rps {
			return b, nil
		}
	}
	o.MaxBatch = 4096
	return 0, fmt.Errorf("enginesim: no batch size up to 4096 reaches %v req/s with these options (at most %.1f req/s)", rps, Capacity(o))
}
