// Package enginesim is a simulated LLM inference engine: an honest model of a
// continuous-batching engine (vLLM-like) that serves the OpenAI HTTP API and
// Switchyard's NATS inference protocol, publishes its signals through the
// engine SDK (services/engine), and lets tests inject failures.
//
// # Model
//
// One scheduler goroutine per engine runs the steps of the continuous-batching
// model of package batching (the one the fleet simulator runs in virtual
// time), on real timers so that clients see real latency:
//
//   - Requests wait in a FIFO queue until a batch slot is free (at most
//     MaxBatch running) and the KV cache can hold prompt plus output tokens.
//   - At a step boundary, waiting requests are admitted and prefilled together
//     in one prefill step lasting Σ prompt_tokens × PrefillMsPerToken, during
//     which decoding pauses (prefill is compute-bound and pre-empts decode, as in
//     vLLM without chunked prefill). Each admitted request gets its first token
//     at the end of the prefill step, so TTFT = queueing + prefill.
//   - Otherwise one decode step gives every running request one token and lasts
//     TBT(b) = BaseTBTMs + TBTGrowthMs × (b − 1) for b running requests.
//   - A request finishes after its output tokens (OutputTokens, or max_tokens
//     when smaller) and frees its slot and KV reservation at once; a client
//     that disconnects frees them at the next step boundary.
//
// Every modelled duration is multiplied by TimeScale and divided by the
// capacity factor of the current failure injection.
//
// # Capacity
//
// At saturation every decode step runs a full batch B, and each request costs
// one prefill p = PromptTokens × PrefillMsPerToken (during which the batch
// stalls) plus its share of T − 1 decode steps. N requests therefore take
// N·p + N·(T−1)·TBT(B)/B, and the sustainable rate is
//
//	capacity_rps = 1000 · B / (B·p + (T − 1)·TBT(B)) · factor / TimeScale
//
// with B = min(MaxBatch, ⌊KVTokens / (PromptTokens + T)⌋), T = OutputTokens
// and all times in ms (batching.Cost.Capacity). Engine.Capacity returns it, and signals carry it as
// capacity_rps. The defaults (B 32, p = 256 × 0.02 ms, T 128, TBT 15 ms +
// 0.1 ms per extra request, so TBT(32) = 18.1 ms) give about 13 req/s.
// BatchForCapacity finds the batch size that reaches a target rate: 100 req/s
// with T = 32 and the other defaults needs B = 260 (TBT 40.9 ms).
//
// # Serving
//
// HTTP: POST /v1/chat/completions and /v1/completions (streaming SSE and
// not), GET /v1/models, GET /healthz, GET /metrics (Prometheus, a registry per
// engine); GET/POST /admin/failure only on the admin listener
// (Options.AdminListen), with health and metrics. Every response carries the header
// x-switchyard-engine. NATS: a core subscription on <prefix>.infer.<model>.<engine>
// answering with the headers messages.HeaderStatus and messages.HeaderLast.
//
// # Prefix cache and KV events
//
// With Options.KVEvents the engine keeps a prefix cache of its prompts'
// 16-token blocks (Tokenize gives the token ids; KVTokens/16 blocks, least
// recently used evicted first): a request's leading cached tokens skip
// prefill (at least one token is computed, as in vLLM) and count as
// vllm:prefix_cache_hits_total, and every store and eviction is published
// as vLLM's KV events over ZMQ (KVPublisher), for the agent's relay.
//
// # Failure injection
//
// Failure (in Options, through SetFailure, or POST /admin/failure with a JSON
// object whose fields are merged into the current setting) injects an error
// rate, added latency, hangs, a crash after N requests, and a capacity drop.
package enginesim
