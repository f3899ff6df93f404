// Package protocol holds what the router knows of the OpenAI API: request
// parsing within the router's limits (ParseRequest), OpenAI-shaped errors
// (APIError, WriteError), the affinity key of a request (AffinityKey) and
// the priority classes a client may ask for (ParsePriority). It does no
// I/O beyond writing an error to an http.ResponseWriter, so both fronts and
// the simulator read requests the same way.
package protocol
