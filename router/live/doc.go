// Package live is a router's live guard: its state of each engine of a
// model (LiveSet, EngineLive: in-flight requests, down and silent marks,
// the load from the engine's signals), the ejection of failing engines
// (EngineLive.Claim and Report), the table bound to that state (Bound, the
// selection.Guard and selection.LoadGuard the picks ask, and PickFallback),
// admission over router/guard's rules (Admission, ProtectionOptions) and a
// retry's next engine (RetryCandidates).
//
// Every part reads the clock it is given, so the router's pipeline drives
// it on the wall clock and the simulator's routers on virtual time, by the
// same rules. It is not part of router/guard because it classifies
// attempts by control.Result and learns engines' addresses through
// control.EndpointResolver, and router/control imports router/guard.
package live
