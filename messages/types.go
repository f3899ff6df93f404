package messages

// SchemaVersion is the schema version this package writes and accepts.
const SchemaVersion = 1

// Kind names what a message holds; it is carried under the key "k".
type Kind string

// The kinds of Switchyard message.
const (
	KindSignal      Kind = "signal"
	KindReport      Kind = "report"
	KindEngineState Kind = "engine_state"
	KindDemandState Kind = "demand_state"
	KindRTTState    Kind = "rtt_state"
	KindWeights     Kind = "weights"
	KindPenalty     Kind = "penalty"
	KindOperator    Kind = "operator"
)

// Transport kinds an engine may accept requests on.
const (
	TransportHTTP = "http"
	TransportNATS = "nats"
)

// Transport says how an engine can be reached: over HTTP at a base URL, or over
// NATS request-reply on a subject.
type Transport struct {
	// Kind is TransportHTTP or TransportNATS.
	Kind string `msgpack:"k" json:"kind"`
	// Address is the base URL (http) or the request subject (nats).
	Address string `msgpack:"a" json:"address"`
}

// EngineSignal is what an engine publishes about itself, a few times a second,
// on sy.signal.<model>.<engine>.
type EngineSignal struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Engine  string `msgpack:"e" json:"engine"`
	// ServedModel is the name the engine itself serves the model under
	// when it is not Model (vLLM's --served-model-name): routers write it
	// into the request's model field when they forward to this engine.
	// Optional; empty means Model.
	ServedModel string `msgpack:"sm,omitempty" json:"served_model,omitempty"`
	// Region is the engine's region (optional).
	Region string `msgpack:"r,omitempty" json:"region,omitempty"`
	// Time is when the signal was taken, in Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// Seq rises by one per signal of this engine; with Engine it makes the dedup id.
	Seq uint64 `msgpack:"n" json:"seq"`
	// TTFTMs is the measured mean time to first token over the last interval, ms.
	TTFTMs float64 `msgpack:"ttft" json:"ttft_ms"`
	// TBTMs is the measured mean time between tokens over the last interval, ms.
	TBTMs float64 `msgpack:"tbt" json:"tbt_ms"`
	// Queue is the number of requests waiting for a batch slot.
	Queue int `msgpack:"q" json:"queue"`
	// Running is the number of requests in the running batch.
	Running int `msgpack:"run" json:"running"`
	// MaxRunning is how many requests the engine runs at once at most (its
	// largest batch, summed over its replicas); optional, 0 when unknown.
	// Routers bound their in-flight requests to the engine by it.
	MaxRunning int `msgpack:"mrun,omitempty" json:"max_running,omitempty"`
	// KVUse is the fraction of the KV cache in use, 0..1.
	KVUse float64 `msgpack:"kv" json:"kv_use"`
	// CapacityRPS is the request rate the engine can sustain, req/s.
	CapacityRPS float64 `msgpack:"cap" json:"capacity_rps"`
	// LoadRPS is the measured arrival rate over the last interval, req/s.
	LoadRPS float64 `msgpack:"rps" json:"load_rps"`
	// OutputTokens is the mean number of output tokens per completed request.
	OutputTokens float64 `msgpack:"otok,omitempty" json:"output_tokens,omitempty"`
	// PromptTokens is the mean number of prompt tokens per request of the
	// mix CapacityRPS is stated for (the requests the engine served, or
	// the mix its capacity was computed for); optional, 0 when unknown.
	// With OutputTokens it turns the capacity into units of work (Work).
	PromptTokens float64 `msgpack:"ptok,omitempty" json:"prompt_tokens,omitempty"`
	// PrefillWeight is what one prompt token costs the engine relative to
	// one output token at a full batch (its prefill time per token over
	// its decode step time per running request); optional, 0 when the
	// engine does not know it (DefaultPrefillWeight is then assumed).
	PrefillWeight float64 `msgpack:"pfw,omitempty" json:"prefill_weight,omitempty"`
	// Replicas is the number of ready replicas behind this engine.
	Replicas int `msgpack:"rep" json:"replicas"`
	// Health is the engine's own view of its health, 0 (down) .. 1 (healthy).
	Health float64 `msgpack:"h" json:"health"`
	// BaseLatencyMs is the engine's own estimate of its engine-side latency
	// (TTFT plus output tokens × TBT) for one request on an idle engine, ms;
	// optional, the optimizer's prior for the engine's latency profile.
	BaseLatencyMs float64 `msgpack:"base,omitempty" json:"base_latency_ms,omitempty"`
	// Transports lists how the engine accepts requests.
	Transports []Transport `msgpack:"tx,omitempty" json:"transports,omitempty"`
}

// EngineOutcome is what one router saw of one engine over a report interval.
type EngineOutcome struct {
	Sent      int64 `msgpack:"s" json:"sent"`
	Succeeded int64 `msgpack:"ok" json:"succeeded"`
	// Errors counts failed attempts by class: "connect", "5xx", "429", "ttft",
	// "other", and "client" (answers that blame the request, which never
	// count against the engine).
	Errors   map[string]int64 `msgpack:"err,omitempty" json:"errors,omitempty"`
	Timeouts int64            `msgpack:"to" json:"timeouts"`
	// LatencyMs is the mean end-to-end latency of succeeded requests, ms.
	LatencyMs float64 `msgpack:"lat" json:"latency_ms"`
	// TTFTMs is the mean time to first byte of succeeded requests, ms.
	TTFTMs float64 `msgpack:"ttft" json:"ttft_ms"`
}

// ErrorClassClient is the EngineOutcome.Errors class of answers that blame
// the request (bad parameters, unknown model, context too long): counted,
// but never against the engine.
const ErrorClassClient = "client"

// RouterReport is what a router publishes every interval on
// sy.report.<model>.<cluster>.<router>: the demand it saw, per-engine outcomes,
// measured RTT to engines, and shed and retry counts.
type RouterReport struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Cluster string `msgpack:"c" json:"cluster"`
	Router  string `msgpack:"ro" json:"router"`
	// Time is the end of the interval, Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// Seq rises by one per report of this router and model.
	Seq uint64 `msgpack:"n" json:"seq"`
	// IntervalS is the length of the interval, seconds (> 0).
	IntervalS float64 `msgpack:"iv" json:"interval_s"`
	// Requests is the number of client requests received in the interval.
	Requests int64 `msgpack:"req" json:"requests"`
	// DemandByPriority splits Requests by priority class (optional).
	DemandByPriority map[string]int64 `msgpack:"pri,omitempty" json:"demand_by_priority,omitempty"`
	// Shed is the number of requests shed in the interval.
	Shed int64 `msgpack:"shed" json:"shed"`
	// Retries is the number of retry attempts in the interval.
	Retries int64 `msgpack:"retry" json:"retries"`
	// Engines holds per-engine outcomes, by engine name.
	Engines map[string]EngineOutcome `msgpack:"eo,omitempty" json:"engines,omitempty"`
	// RTTMs is the measured network round trip to engines, ms, by engine name.
	RTTMs map[string]float64 `msgpack:"rtt,omitempty" json:"rtt_ms,omitempty"`
	// PromptTokens is the prompt tokens of the interval's client requests,
	// summed, as the router estimated them at admission (optional).
	PromptTokens int64 `msgpack:"ptok,omitempty" json:"prompt_tokens,omitempty"`
	// Completed counts the requests of the interval whose output tokens
	// the router counted, and OutputTokens sums those (both optional).
	Completed    int64 `msgpack:"done,omitempty" json:"completed,omitempty"`
	OutputTokens int64 `msgpack:"otok,omitempty" json:"output_tokens,omitempty"`
}

// Engine status values in EngineState.
const (
	StatusUp    = "up"
	StatusStale = "stale"
	StatusDown  = "down"
)

// Window holds a fast and a slow exponentially weighted moving average of one signal.
type Window struct {
	Fast float64 `msgpack:"f" json:"fast"`
	Slow float64 `msgpack:"s" json:"slow"`
}

// EngineState is the aggregator's view of one engine, stored in sy_engines
// under <model>.<engine>.
type EngineState struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Engine  string `msgpack:"e" json:"engine"`
	Region  string `msgpack:"r,omitempty" json:"region,omitempty"`
	// Status is StatusUp, StatusStale or StatusDown.
	Status string `msgpack:"st" json:"status"`
	// Time is when the state was written, Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// LastSignal is the time of the newest signal folded in, Unix milliseconds.
	LastSignal int64 `msgpack:"ls" json:"last_signal_ms"`
	// LastSeq is the sequence number of the newest signal folded in.
	LastSeq uint64 `msgpack:"n" json:"last_seq"`
	// Signals counts the signals folded in since the state was created.
	Signals uint64 `msgpack:"ns" json:"signals"`
	// Smoothed windows of the engine's signals.
	TTFTMs       Window `msgpack:"ttft" json:"ttft_ms"`
	TBTMs        Window `msgpack:"tbt" json:"tbt_ms"`
	Queue        Window `msgpack:"q" json:"queue"`
	Running      Window `msgpack:"run" json:"running"`
	KVUse        Window `msgpack:"kv" json:"kv_use"`
	LoadRPS      Window `msgpack:"rps" json:"load_rps"`
	OutputTokens Window `msgpack:"otok" json:"output_tokens"`
	// PromptTokens smooths the signals' PromptTokens (zero when none says).
	PromptTokens Window `msgpack:"ptok,omitempty" json:"prompt_tokens,omitempty"`
	// InFlight is the requests queued plus running in the newest signal
	// folded in: what the windows above smooth, as it is now (whether a
	// drained engine is empty).
	InFlight int64 `msgpack:"inf,omitempty" json:"in_flight"`
	// CapacityRPS, Replicas, Health and BaseLatencyMs are the latest reported values.
	CapacityRPS   float64 `msgpack:"cap" json:"capacity_rps"`
	Replicas      int     `msgpack:"rep" json:"replicas"`
	Health        float64 `msgpack:"h" json:"health"`
	BaseLatencyMs float64 `msgpack:"base,omitempty" json:"base_latency_ms,omitempty"`
	// PrefillWeight is the latest reported EngineSignal.PrefillWeight.
	PrefillWeight float64 `msgpack:"pfw,omitempty" json:"prefill_weight,omitempty"`
	// Transports are the engine's latest advertised transports.
	Transports []Transport `msgpack:"tx,omitempty" json:"transports,omitempty"`
	// Outcomes is what routers saw of the engine, folded from their reports;
	// nil until a report names the engine.
	Outcomes *EngineOutcomes `msgpack:"oc,omitempty" json:"outcomes,omitempty"`
}

// EngineOutcomes is the aggregator's view of one engine as routers see it,
// folded from the per-engine outcomes of all routers' reports. The rates are
// ratios of exponentially decayed sums over all routers (Fast and Slow use the
// aggregator's two half-lives, in wall time), so that a router sending much
// weighs much.
type EngineOutcomes struct {
	// LastReport is the time of the newest report naming the engine, Unix ms.
	LastReport int64 `msgpack:"lr" json:"last_report_ms"`
	// LastSent is the time of the newest report in which the engine was sent
	// requests, Unix ms; 0 when none was.
	LastSent int64 `msgpack:"ls,omitempty" json:"last_sent_ms,omitempty"`
	// Reports counts the reports naming the engine that were folded in.
	Reports uint64 `msgpack:"n" json:"reports"`
	// SentRPS is the rate of attempts sent to the engine, summed over routers, req/s.
	SentRPS Window `msgpack:"s" json:"sent_rps"`
	// ErrorRate is failed attempts over attempts sent, 0..1. Failures are the
	// report's error classes except "429" (the engine shedding its own load,
	// which its capacity already accounts for) and "client" (the request was
	// at fault); timeouts are apart.
	ErrorRate Window `msgpack:"er" json:"error_rate"`
	// TimeoutRate is timed-out attempts over attempts sent, 0..1.
	TimeoutRate Window `msgpack:"to" json:"timeout_rate"`
	// TTFTMs is the time to first byte of succeeded attempts as routers
	// measured it (network included), ms; zero until one succeeded.
	TTFTMs Window `msgpack:"ttft" json:"ttft_ms"`
	// FailedIntervals counts consecutive reports in which the engine was sent
	// requests, none succeeded and some failed or timed out; a report with a
	// success resets it.
	FailedIntervals int `msgpack:"fi" json:"failed_intervals"`
}

// Penalty phases.
const (
	// PhasePenalised: the multiplier holds until Until.
	PhasePenalised = "penalised"
	// PhaseRecovering: slow start, the multiplier ramps linearly from
	// Multiplier at Until to 1 at RecoverUntil.
	PhaseRecovering = "recovering"
	// PhaseRecovered: the engine is back at full weight; Strikes are
	// remembered until the record is deleted.
	PhaseRecovered = "recovered"
)

// Reasons for a penalty.
const (
	ReasonFailures  = "consecutive_failures"
	ReasonErrorRate = "error_rate"
	ReasonTimeouts  = "timeouts"
	ReasonSlowTTFT  = "slow_ttft"
)

// Penalty is the optimizer's penalty of one engine, written by the optimizer
// leader to sy_engines under penalty.<model>.<engine> so that people and the
// dashboard can see why an engine gets less traffic.
type Penalty struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Engine  string `msgpack:"e" json:"engine"`
	// Time is when the record was written, Unix ms.
	Time int64 `msgpack:"t" json:"time_ms"`
	// Phase is PhasePenalised, PhaseRecovering or PhaseRecovered.
	Phase string `msgpack:"ph" json:"phase"`
	// Multiplier is the health multiplier on the engine's capacity while
	// penalised (and where the slow start begins), 0..1.
	Multiplier float64 `msgpack:"mul" json:"multiplier"`
	// Reason is one of the Reason constants.
	Reason string `msgpack:"why" json:"reason"`
	// Detail says what was measured, for people.
	Detail string `msgpack:"d,omitempty" json:"detail,omitempty"`
	// Since is when the penalty began, Until when it ends and RecoverUntil
	// when the slow start after it ends, Unix ms.
	Since        int64 `msgpack:"since" json:"since_ms"`
	Until        int64 `msgpack:"until" json:"until_ms"`
	RecoverUntil int64 `msgpack:"rec" json:"recover_until_ms"`
	// Strikes counts the penalties in a row; each doubles the penalty time.
	Strikes int `msgpack:"n" json:"strikes"`
}

// Operator actions.
const (
	// ActionDrain: no new traffic (weight 0); requests in flight finish.
	ActionDrain = "drain"
	// ActionCordon: no new traffic, like drain for the optimizer, shown
	// apart (the engine is kept out, for example while it is investigated).
	ActionCordon = "cordon"
	// ActionHealth pins the engine's health multiplier to Health.
	ActionHealth = "health"
)

// Operator is a person's override of one engine, written by `switchyard
// engine drain|cordon|health` to sy_engines under operator.<engine> and
// removed by `switchyard engine restore`. The optimizer obeys it.
type Operator struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Engine  string `msgpack:"e" json:"engine"`
	// Model limits the override to one model; empty means every model.
	Model string `msgpack:"m,omitempty" json:"model,omitempty"`
	// Action is ActionDrain, ActionCordon or ActionHealth.
	Action string `msgpack:"a" json:"action"`
	// Health is the pinned multiplier for ActionHealth, 0..1.
	Health float64 `msgpack:"h,omitempty" json:"health,omitempty"`
	// Reason says why, for people.
	Reason string `msgpack:"why,omitempty" json:"reason,omitempty"`
	// By names who set it (user@host).
	By string `msgpack:"by,omitempty" json:"by,omitempty"`
	// Time is when it was set, Unix ms.
	Time int64 `msgpack:"t" json:"time_ms"`
}

// DemandState is the aggregator's view of demand for one model in one frontend
// cluster, stored in sy_demand under <model>.<cluster>.
type DemandState struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Cluster string `msgpack:"c" json:"cluster"`
	// Time is when the state was written, Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// LastReport is the time of the newest report folded in, Unix milliseconds.
	LastReport int64 `msgpack:"lr" json:"last_report_ms"`
	// Reports counts the reports folded in.
	Reports uint64 `msgpack:"nr" json:"reports"`
	// RPS is the request rate, req/s, summed over the cluster's routers.
	RPS Window `msgpack:"rps" json:"rps"`
	// RPSByPriority is the request rate by priority class.
	RPSByPriority map[string]Window `msgpack:"pri,omitempty" json:"rps_by_priority,omitempty"`
	// ShedRPS and RetryRPS are the shed and retry rates, per second.
	ShedRPS  Window `msgpack:"shed" json:"shed_rps"`
	RetryRPS Window `msgpack:"retry" json:"retry_rps"`
	// Routers holds each reporting router's share of the demand.
	Routers map[string]RouterDemand `msgpack:"ro,omitempty" json:"routers,omitempty"`
	// The cluster's mix, summed over the routers that report it: prompt
	// tokens per second (PromptTPS), requests per second whose output
	// tokens were counted (DoneRPS) and their output tokens per second
	// (OutputTPS). Mix turns them into mean tokens per request.
	PromptTPS Window `msgpack:"ptps,omitempty" json:"prompt_tps,omitempty"`
	DoneRPS   Window `msgpack:"drps,omitempty" json:"done_rps,omitempty"`
	OutputTPS Window `msgpack:"otps,omitempty" json:"output_tps,omitempty"`
	// RPSVar is the variance of the request rate over one second, summed
	// over the routers, (req/s)² (see Smoother.UpdateVariance).
	RPSVar Window `msgpack:"rvar,omitempty" json:"rps_var,omitempty"`
}

// RouterDemand is one router's contribution to a cluster's demand.
type RouterDemand struct {
	// LastReport is the time of the router's newest report, Unix ms.
	LastReport int64 `msgpack:"t" json:"last_report_ms"`
	// Seq is the sequence number of the router's newest report folded in.
	Seq uint64 `msgpack:"n" json:"seq"`
	// RPS is the router's request rate, req/s.
	RPS Window `msgpack:"rps" json:"rps"`
	// Priority holds the router's request rate by priority class.
	Priority map[string]Window `msgpack:"pri,omitempty" json:"rps_by_priority,omitempty"`
	// ShedRPS and RetryRPS are the router's shed and retry rates.
	ShedRPS  Window `msgpack:"shed" json:"shed_rps"`
	RetryRPS Window `msgpack:"retry" json:"retry_rps"`
	// PromptTPS, DoneRPS, OutputTPS and RPSVar are the router's parts of
	// the DemandState fields of the same names.
	PromptTPS Window `msgpack:"ptps,omitempty" json:"prompt_tps,omitempty"`
	DoneRPS   Window `msgpack:"drps,omitempty" json:"done_rps,omitempty"`
	OutputTPS Window `msgpack:"otps,omitempty" json:"output_tps,omitempty"`
	RPSVar    Window `msgpack:"rvar,omitempty" json:"rps_var,omitempty"`
}

// RTTState is the aggregator's view of the network round trip from one frontend
// cluster to one engine, stored in sy_demand under rtt.<cluster>.<engine>.
type RTTState struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Cluster string `msgpack:"c" json:"cluster"`
	Engine  string `msgpack:"e" json:"engine"`
	Time    int64  `msgpack:"t" json:"time_ms"`
	RTTMs   Window `msgpack:"rtt" json:"rtt_ms"`
	Samples uint64 `msgpack:"ns" json:"samples"`
}

// WeightSnapshot is the optimizer's routing decision for one model in one
// frontend cluster, stored in sy_weights under <model>.<cluster>.
type WeightSnapshot struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Cluster string `msgpack:"c" json:"cluster"`
	// Generation rises with every snapshot the optimizer writes for this key.
	Generation uint64 `msgpack:"g" json:"generation"`
	// Time is when the snapshot was computed, Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// Weights is the fraction of the cluster's traffic per engine, 0..1.
	Weights map[string]float64 `msgpack:"w" json:"weights"`
	// ShedFraction is the fraction of the cluster's demand to shed, 0..1.
	ShedFraction float64 `msgpack:"s" json:"shed_fraction"`
	// ShedByPriority is the fraction of each priority class's demand to shed.
	ShedByPriority map[string]float64 `msgpack:"sp,omitempty" json:"shed_by_priority,omitempty"`
	// DemandRPS is the demand the snapshot was computed for, req/s.
	DemandRPS float64 `msgpack:"d" json:"demand_rps"`
	// Utilisation is each engine's predicted load over its effective capacity.
	Utilisation map[string]float64 `msgpack:"u,omitempty" json:"utilisation,omitempty"`
	// LatencyMs is each engine's predicted latency (network plus engine), ms.
	LatencyMs map[string]float64 `msgpack:"lat,omitempty" json:"latency_ms,omitempty"`
	// Gap is the solver's relative optimality gap.
	Gap float64 `msgpack:"gap" json:"gap"`
	// Writer names the optimizer instance that wrote the snapshot.
	Writer string `msgpack:"wr,omitempty" json:"writer,omitempty"`
	// SlotEngines and Slots, both optional, are the selection table that
	// routers install for this snapshot, computed by the optimizer from the
	// previous snapshot's table so that every router maps keys alike and a
	// weight change moves no more keys than it must. With both empty,
	// routers compute a table from Weights alone.
	//
	// SlotEngines lists the engines the slots refer to: distinct, each a
	// key of Weights.
	SlotEngines []string `msgpack:"se,omitempty" json:"slot_engines,omitempty"`
	// Slots holds one little-endian uint16 per slot, an index into
	// SlotEngines; the slot count, len(Slots)/2, is a power of two from
	// MinSnapshotSlots to MaxSnapshotSlots. A router maps a request's
	// affinity key to slot key >> (64 − log2(count)).
	Slots []byte `msgpack:"sl,omitempty" json:"slots,omitempty"`
}

// Bounds on the slot count of a WeightSnapshot's selection table.
const (
	// MinSnapshotSlots is the least slot count a snapshot may carry.
	MinSnapshotSlots = 1 << 10
	// MaxSnapshotSlots is the largest slot count a snapshot may carry
	// (128 KiB of slots).
	MaxSnapshotSlots = 1 << 16
)
