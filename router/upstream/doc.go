// Package upstream holds the router's transports to engines: the HTTP/1.1
// client with its own connection pools over raw-syscall connections
// (HTTPTransport), the NATS request-reply transport with its shared reply
// subscription (NATSTransport), and the policy that picks one per engine
// from its endpoints (TransportPolicy). A front hands a transport one
// Request per attempt and relays the Response; the request's context may
// close the connection itself when it ends (CloseHook).
//
// It depends on the selection table's Engine and the control plane's
// endpoints only: the router imports it, never the other way round.
package upstream
