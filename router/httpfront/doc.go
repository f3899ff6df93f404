// Package httpfront is the router's OpenAI HTTP front: the two servers
// (fasthttp, the default, and net/http; ServerKind, ServerOptions,
// NewServer), the translation of their requests into the pipeline's
// protocol.ClientRequest, the answer's head, and the fasthttp server's
// watch of clients that went away.
//
// It reaches the router only through the narrow Pipeline and Answer
// interfaces (router.NewServer hands it router.Handler's), so validation,
// routing, retries and bookkeeping exist once, in the pipeline both fronts
// run; the router imports it, never the other way round.
package httpfront
