// Package agent is the engine sidecar behind `switchyard agent`: for each
// engine it serves (one or several on a node, each by URL), it scrapes the
// engine's own Prometheus /metrics (vLLM, SGLang, TGI or llama.cpp names)
// and its health endpoint every Options.Interval, derives Switchyard signal
// fields from them (see Estimator for the method behind each field), and
// publishes messages.EngineSignal under the engine's own name through the
// engine SDK's Publisher (services/engine).
//
// Robustness rules:
//   - A slow or failed scrape is not a down engine. The agent keeps
//     publishing the last values for Options.StaleAfter after the last good
//     scrape, then goes silent: it never publishes health 0 for an engine
//     it merely cannot see, and routers treat a silent engine as unknown.
//   - Health is 0 only after Options.HealthFailures consecutive definite
//     failures of the health endpoint (an error status, or a refused
//     connection: nothing listening).
//   - Metrics text is input from the network: Parse never panics, drops a
//     few malformed lines and re-parses around them, and caps the body size.
//   - Counters that go down mean the engine restarted; deltas then start
//     from zero.
package agent
