// Package natsfront is the router's NATS front: it takes OpenAI requests
// on <prefix>.req.<cluster>.<model> in the cluster's queue group, runs each
// through the router's request pipeline (Pipeline, which router.Handler
// implements: the same checks, route, retries and bookkeeping as the HTTP
// front's) and relays the engine's answer as reply messages.
//
// It translates between NATS and the pipeline only: the router imports
// it, never the other way round.
package natsfront
