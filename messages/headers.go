package messages

// Header names of the request path: the contract between clients, routers
// and engines, over HTTP (the OpenAI API) and over NATS request-reply
// (sy.req.<cluster>.<model> into routers, sy.infer.<model>.<engine> into
// engines). HTTP header names are case-insensitive and written here in their
// canonical form; NATS headers are case-sensitive, so writers use the
// lower-case NATS forms and routers read either.
const (
	// HeaderEngine names the engine that served a request, on the answer.
	HeaderEngine = "X-Switchyard-Engine"
	// HeaderRequestID carries the request's id, passed through to the engine.
	HeaderRequestID = "X-Request-Id"
	// HeaderSessionID carries a conversation's id, the strongest affinity hint.
	HeaderSessionID = "X-Session-Id"
	// HeaderPriority carries a request's priority class: critical, standard
	// (the default) or sheddable.
	HeaderPriority = "X-Switchyard-Priority"
	// HeaderAuthorization carries a client's API key as "Bearer <key>", as
	// OpenAI's clients send it; with keys configured the router checks it
	// and does not forward it (router/tenant).
	HeaderAuthorization = "Authorization"
	// HeaderAPIKey carries a client's API key as Azure OpenAI's clients send it.
	HeaderAPIKey = "Api-Key"
	// HeaderXAPIKey carries a client's API key as some gateways send it.
	HeaderXAPIKey = "X-Api-Key"

	// NATSHeaderEngine is HeaderEngine as written on NATS messages.
	NATSHeaderEngine = "x-switchyard-engine"
	// NATSHeaderRequestID is HeaderRequestID as written on NATS messages.
	NATSHeaderRequestID = "x-request-id"
	// NATSHeaderSessionID is HeaderSessionID as written on NATS messages.
	NATSHeaderSessionID = "x-session-id"
	// NATSHeaderPriority is HeaderPriority as written on NATS messages.
	NATSHeaderPriority = "x-switchyard-priority"
	// NATSHeaderAuthorization is HeaderAuthorization as written on NATS messages.
	NATSHeaderAuthorization = "authorization"
	// NATSHeaderAPIKey is HeaderAPIKey as written on NATS messages.
	NATSHeaderAPIKey = "api-key"
	// NATSHeaderXAPIKey is HeaderXAPIKey as written on NATS messages.
	NATSHeaderXAPIKey = "x-api-key"

	// HeaderLast marks the last reply message of a NATS inference request,
	// with the value "true".
	HeaderLast = "Sy-Last"
	// HeaderStatus carries an HTTP-like status code ("200", "400", "500",
	// ...) on every NATS inference reply message.
	HeaderStatus = "Sy-Status"
)
