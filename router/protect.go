package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// Defaults of ProtectionOptions.
const (
	DefaultMaxAttempts           = 3
	DefaultFirstByteTimeout      = 10 * time.Second
	DefaultWholeFirstByteTimeout = 60 * time.Second
	DefaultAdmissionSlack        = 0.5
	DefaultMinInFlight           = 8
	DefaultRetryAfter            = time.Second
)

// ProtectionOptions tunes the router's guards on the request path: the fast
// local skip of failing engines, retries and their budget, and load
// shedding. The zero value selects the defaults.
type ProtectionOptions struct {
	// Eject tunes the fast local skip of failing engines.
	Eject EjectOptions
	// MaxAttempts bounds the upstream attempts of one request, the first
	// included (default DefaultMaxAttempts; 1 disables retries).
	MaxAttempts int
	// FirstByteTimeout is the per-attempt deadline for the first byte of a
	// streamed answer (default DefaultFirstByteTimeout); past it the attempt
	// counts as a timeout and the request is retried elsewhere.
	FirstByteTimeout time.Duration
	// WholeFirstByteTimeout is the same deadline for a non-streamed answer,
	// whose first byte comes when the generation is done (default
	// DefaultWholeFirstByteTimeout).
	WholeFirstByteTimeout time.Duration
	// Budget tunes the router-wide retry budget.
	Budget guard.BudgetOptions
	// Routers is the number of routers sharing the cluster's demand, for
	// the admission allotment (default 1).
	Routers int
	// AdmissionSlack is the slack over the Little's-law in-flight estimate
	// (default DefaultAdmissionSlack).
	AdmissionSlack float64
	// MinInFlight is the least allotment (default DefaultMinInFlight).
	MinInFlight int
	// NoAdmission turns local admission control off: the capacity
	// allotment while the snapshot sheds, the latency allotment otherwise.
	NoAdmission bool
	// NoSnapshotShed turns off enforcing the snapshot's shed fractions.
	NoSnapshotShed bool
	// RetryAfter is the Retry-After of shed answers (default
	// DefaultRetryAfter, rounded up to whole seconds).
	RetryAfter time.Duration
	// SlotHeadroom is how much more than the snapshot plans to serve the
	// router lets through to the capacity allotment (CapacityAllotment)
	// while the snapshot sheds (default DefaultSlotHeadroom; NoSlotHeadroom
	// for none): the snapshot's shed fraction s is enforced as RelaxedShed(s,
	// SlotHeadroom) while the batch slots of an engine of the model are
	// known from its signals. A fluid plan that fills the engines exactly,
	// admitted through a bound on batch slots, would serve less than their
	// capacity (requests arrive in bursts and a request that finds no free
	// slot is shed, an Erlang loss); the headroom keeps the slots full and
	// the allotment sheds the rest at once, sheddable requests first.
	SlotHeadroom float64
	// NoSlotHeadroom enforces the snapshot's shed fractions as planned,
	// with no headroom for the capacity allotment.
	NoSlotHeadroom bool
}

func (o ProtectionOptions) withDefaults() ProtectionOptions {
	o.Eject = o.Eject.withDefaults()
	o.Budget = o.Budget.WithDefaults()
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.FirstByteTimeout <= 0 {
		o.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if o.WholeFirstByteTimeout <= 0 {
		o.WholeFirstByteTimeout = DefaultWholeFirstByteTimeout
	}
	if o.Routers <= 0 {
		o.Routers = 1
	}
	if o.AdmissionSlack <= 0 {
		o.AdmissionSlack = DefaultAdmissionSlack
	}
	if o.MinInFlight <= 0 {
		o.MinInFlight = DefaultMinInFlight
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	switch {
	case o.NoSlotHeadroom:
		o.SlotHeadroom = 0
	case o.SlotHeadroom == 0:
		o.SlotHeadroom = guard.DefaultSlotHeadroom
	}
	return o
}

// RegionResolver gives engines' regions; Signals implements it. Retries try
// engines in the failed engine's region first.
type RegionResolver interface {
	// Region returns the engine's region, "" when unknown.
	Region(model, engine string) string
}

// GuardObserver is an Observer that is also told about requests' priority
// classes, shed requests and retries; a Reporter implements it.
type GuardObserver interface {
	control.Observer
	// Priority counts the class of one client request (after Request).
	Priority(model string, p protocol.Priority)
	// Shed counts one shed request.
	Shed(model string, p protocol.Priority, reason guard.ShedReason)
	// Retry counts one retry attempt.
	Retry(model string)
}

// admissionUtilisation is the predicted utilisation from which local
// admission control applies when the snapshot sheds nothing.
const admissionUtilisation = 0.9

// routed is a request the router admitted and picked a first engine for.
type routed struct {
	model    string
	table    *selection.Table
	bound    *Bound
	ms       *modelState
	idx      int
	key      uint64
	src      protocol.KeySource
	prio     protocol.Priority
	ep       protocol.Endpoint
	spare    []string // the snapshot's engines of weight zero, nearest first (Figures.Spare)
	fallback bool     // every engine was ejected: ejections are ignored
}

// release ends the request's admission.
func (rt *routed) release() { rt.ms.adm.Done() }

// shedError is the answer to a shed request.
func (h *Handler) shedError(model string, p protocol.Priority, reason guard.ShedReason, detail string) *protocol.APIError {
	h.metrics.shed.WithLabelValues(string(reason), p.String()).Inc()
	if g, ok := h.opts.Observer.(GuardObserver); ok {
		g.Shed(model, p, reason)
	}
	if reason == guard.ShedUnplanned {
		// Not an overload: the plan has no engine for this cluster.
		return protocol.NewAPIError(http.StatusTooManyRequests, protocol.ErrTypeUnavailable, "no_engine_planned", "",
			fmt.Sprintf("no engine of model %q is planned for cluster %q (%s); %s request shed; retry later", model, h.opts.Cluster, detail, p))
	}
	return protocol.NewAPIError(http.StatusTooManyRequests, protocol.ErrTypeUnavailable, "overloaded", "",
		fmt.Sprintf("model %q is overloaded; %s request shed (%s); retry later", model, p, detail))
}

// retryAfter is the Retry-After header value of shed answers.
func (h *Handler) retryAfter() string {
	return strconv.Itoa(int(math.Ceil(h.prot.RetryAfter.Seconds())))
}

// admit applies the snapshot's shed fraction and the local admission
// control to a request of class p with key on model (Admission.Admit),
// and returns the fleet utilisation the retry budget earns at, or a 429.
func (h *Handler) admit(model string, ms *modelState, info control.Info, bound *Bound, key uint64, src protocol.KeySource, p protocol.Priority) (float64, *protocol.APIError) {
	u, reason, detail := ms.adm.Admit(h.opts.Now(), info.Figures, bound, ms.recent, key, src, p)
	if reason != "" {
		return 0, h.shedError(model, p, reason, detail)
	}
	return u, nil
}

// Admission is one model's admission control at one router: the mix of
// its requests' priority classes and the requests admitted and not yet
// answered, with the options its decisions use. The Handler keeps one per
// model; the simulator drives one per simulated router, each on its own
// clock, so that both shed by the same rules. It is safe for concurrent
// use.
type Admission struct {
	prot     ProtectionOptions
	mix      guard.PriorityMix
	admitted atomic.Int64 // admitted requests not yet answered
}

// NewAdmission returns the admission control of one model under prot
// (zero fields: the defaults).
func NewAdmission(prot ProtectionOptions) *Admission {
	return &Admission{prot: prot.withDefaults()}
}

// Done ends the admission of a request Admit admitted.
func (a *Admission) Done() { a.admitted.Add(-1) }

// Admit applies the snapshot's figures f (nil: none) and the local
// admission control at now to a request of class p with key from src,
// bound to the model's current table, recent being where the router sent
// keys lately (nil: none known). It returns the fleet utilisation the
// retry budget earns at, or the reason the request is shed and what to
// tell the client; an admitted request must be ended with Done.
func (a *Admission) Admit(now time.Time, f *guard.Figures, bound *Bound, recent *selection.RecentKeys, key uint64, src protocol.KeySource, p protocol.Priority) (u float64, shed guard.ShedReason, detail string) {
	prot := &a.prot
	a.mix.Add(p, now)
	shedding := f != nil && (f.ShedFraction > 0 || f.HasShedByPriority)
	// While the snapshot sheds, the engines are planned at their capacity,
	// and admission bounds the requests in flight by their batch slots
	// (CapacityAllotment) when their signals tell them.
	var slot, step float64
	capacityBound := false
	if shedding && !prot.NoAdmission {
		slot, step, capacityBound = bound.SlotTimes()
	}
	if shedding && !prot.NoSnapshotShed && f.Unplanned {
		return 0, guard.ShedUnplanned, "none is up, or none has a network latency the optimizer knows from this cluster"
	}
	if shedding && !prot.NoSnapshotShed {
		fr := f.ShedByPriority
		switch {
		case prot.SlotHeadroom > 0 && capacityBound:
			// The capacity allotment sheds what the engines cannot take at once;
			// the snapshot's shed, relaxed, keeps the order of classes
			// and of keys (see ProtectionOptions.SlotHeadroom).
			fr = guard.ShedFractions(guard.RelaxedShed(f.ShedFraction, prot.SlotHeadroom), a.mix.Shares(now))
		case !f.HasShedByPriority:
			fr = guard.ShedFractions(f.ShedFraction, a.mix.Shares(now))
		}
		if guard.KeyUnit(key) < fr[p] {
			return 0, guard.ShedSnapshot, fmt.Sprintf("the fleet serves %.0f%% of %s demand", 100*(1-fr[p]), p)
		}
	}
	if f != nil {
		u = f.Utilisation
	}
	n := a.admitted.Add(1)
	// The capacity allotment: the batch slots plus a fraction of a decode
	// step's queue, not Little's law on the snapshot's predicted latency,
	// which its queue curve puts far above a batching engine's near
	// capacity (see CapacityAllotment).
	if lim := guard.CapacityAllotment(f, prot.Routers, slot, step, p, prot.MinInFlight); capacityBound && lim > 0 {
		if float64(n) > lim && (p == protocol.PriorityCritical || !ongoing(src, key, recent) ||
			float64(n) > guard.CapacityAllotmentSteps(f, prot.Routers, slot, step, guard.QueueSteps(p)+ongoingSteps, prot.MinInFlight)) {
			a.admitted.Add(-1)
			return 0, guard.ShedAdmission, fmt.Sprintf("%d requests in flight at this router, capacity allotment %.0f", n-1, lim)
		}
		std := guard.CapacityAllotment(f, prot.Routers, slot, step, protocol.PriorityStandard, prot.MinInFlight)
		return math.Max(u, float64(n)/std), "", ""
	}
	// Admission control guards a fleet the snapshot already plans near its
	// limit (it sheds, or predicts the engines this router uses at 90% or
	// more); with headroom a burst is the engines' to absorb.
	if f != nil && f.ShedFraction == 0 && !f.HasShedByPriority && f.Utilisation < admissionUtilisation {
		return u, "", ""
	}
	// The snapshot's demand can lag a rise (it is rewritten only when the
	// weights move or on the heartbeat); a rate this router measured itself
	// over the last 10–20 s keeps steady traffic admitted, so admission
	// control only cuts bursts above the recent rate. Sustained overload is
	// the optimizer's to shed, through the snapshot's shed fraction.
	if f != nil {
		if local := a.mix.Rate(now) * float64(max(prot.Routers, 1)) / (1 - math.Min(f.ShedFraction, 0.99)); local > f.DemandRPS {
			g := *f
			g.DemandRPS = local
			f = &g
		}
	}
	if lim := guard.Allotment(f, prot.Routers, prot.AdmissionSlack, prot.MinInFlight); lim > 0 {
		if !prot.NoAdmission && float64(n) > lim*guard.AdmissionFactor(p) {
			a.admitted.Add(-1)
			return 0, guard.ShedAdmission, fmt.Sprintf("%d requests in flight at this router, allotment %.0f", n-1, lim)
		}
		u = math.Max(u, float64(n)/lim)
	}
	return u, "", ""
}

// errEngineBroke marks relay errors on the engine's side (its body failed),
// as opposed to the client's.
var errEngineBroke = errors.New("engine stream broke")

// errClientGone marks a request whose client went away during forwarding.
var errClientGone = errors.New("client went away")

// attempt is the upstream attempt a request committed to: its response
// is relayed to the client. finish must be called when the relay ends.
type attempt struct {
	idx      int
	engine   selection.Engine
	resp     *upstream.Response
	first    []byte // body bytes already read, to be relayed first
	probe    bool
	recorded bool // outcome already recorded (a failed last attempt relayed as is)
	start    time.Time
	n        int
	ctx      *hookCtx // the attempt's context, canceled by finish
	rt       *routed
}

// finish ends the attempt: closes the body and releases its context and
// in-flight count.
func (a *attempt) finish() {
	_ = a.resp.Body.Close()
	a.ctx.cancel()
	a.rt.bound.Release(a.idx)
}

// retryReason is the reason label of a retry after result r.
func retryReason(r control.Result) string {
	if r == control.ResultTimeout {
		return "timeout"
	}
	if c := r.Class(); c != "" {
		return c
	}
	return "other"
}

// FirstInHand is implemented by a response body that can tell whether its
// first byte is in hand when Forward returns (a NATS reply stream returns
// only once the first reply arrived); the retry loop then does not wait
// for it under the first-byte timeout. Any Transport's body may implement
// it.
type FirstInHand interface {
	// FirstInHand reports whether the body's first byte is in hand.
	FirstInHand() bool
}

// bodyInHand reports whether a response body's first byte is known to be
// in hand when Forward returns (see FirstInHand).
func bodyInHand(b io.Reader) bool {
	f, ok := b.(FirstInHand)
	return ok && f.FirstInHand()
}

// forward sends the request to rt's engine and, on a failure before any
// response byte is in hand, to the key's next candidates, within
// MaxAttempts and the retry budget. It returns the attempt to relay, whose
// first body bytes (read into buf) are in hand; nothing has been written
// to the client. Structurally no retry can follow a byte sent to the
// client: the caller writes only after forward returns.
func (h *Handler) forward(ctx context.Context, rt *routed, up *upstream.Request, buf []byte, log *reqLog) (*attempt, *protocol.APIError) {
	var triedBuf [8]int
	tried := triedBuf[:0]
	idx := rt.idx
	timeout := h.prot.WholeFirstByteTimeout
	if up.Stream {
		timeout = h.prot.FirstByteTimeout
	}
	for n := 1; ; n++ {
		if !rt.bound.Reachable(idx) {
			// No address since Pick (its endpoints withdrawn): another
			// engine, not counted as an attempt nor against this one.
			tried = append(tried, idx)
			next, found := h.passOver(rt, tried, idx)
			if !found {
				return nil, noEngineError(rt.model)
			}
			idx, n = next, n-1
			continue
		}
		live := rt.bound.Live(idx)
		ok, probe := live.Claim(h.opts.Now())
		if !ok && !rt.fallback {
			// Ejected (or its half-open probe taken) since Pick: another
			// engine, not counted as an attempt.
			tried = append(tried, idx)
			if next, found := h.nextCandidate(rt, tried, idx); found {
				idx, n = next, n-1
				continue
			}
		}
		eng := rt.table.Engine(idx)
		tried = append(tried, idx)
		rt.bound.Acquire(idx)
		actx := newAttemptCtx(ctx, timeout) // ends with ctx, on cancel or after timeout
		h.metrics.attempts.Inc()
		h.amp.Add(0, 1)
		start := h.opts.Now()
		resp, err := h.opts.Transport.Forward(actx, eng, up)
		if errors.Is(err, upstream.ErrNoTransport) {
			// The router has no way to reach the engine, which says
			// nothing about the engine: another one, with no outcome,
			// ejection or retry counted.
			if probe {
				live.eject.probing.Store(false)
			}
			actx.cancel()
			rt.bound.Release(idx)
			next, found := h.passOver(rt, tried, idx)
			if !found {
				return nil, noEngineError(rt.model)
			}
			idx, n = next, n-1
			continue
		}
		res := control.ResultOK
		var first []byte
		switch {
		case err != nil:
			res = classifyForwardError(actx, err)
		case resp.Status >= 400:
			res = control.StatusResult(resp.Status)
		case resp.Status < 300 && !bodyInHand(resp.Body):
			k, rerr := readFirst(resp.Body, buf)
			switch {
			case k > 0:
				first = buf[:k]
			case rerr == io.EOF:
			default:
				res = control.ResultConnect // the engine closed or failed before its first byte
			}
		}
		if actx.timedOut() {
			res = control.ResultTimeout // the deadline fired; the attempt's context is gone
		}
		if ctx.Err() != nil {
			res = control.ResultCanceled
		}
		if res == control.ResultClient || res == control.ResultOther {
			// The engine answered, and the answer is about the request (a
			// client error) or not one a retry would change (another
			// 4xx): it is relayed as it is, never retried elsewhere, and
			// finishAttempt records it by the same classification.
			h.countEngine(rt, eng.Name, resp.Status)
			if res == control.ResultClient {
				h.metrics.clientErrors.WithLabelValues(rt.model, eng.Name).Inc()
			}
			if probe {
				h.ejectReport(rt.model, eng.Name, live, res, probe, nil, log)
			}
			return &attempt{idx: idx, engine: eng, resp: resp, probe: probe, start: start, n: n, ctx: actx, rt: rt}, nil
		}
		if res == control.ResultOK {
			h.countEngine(rt, eng.Name, resp.Status)
			if idx != rt.idx && rt.src != protocol.KeyNone {
				// A retry placed the key elsewhere: the engine that
				// serves it now holds its newest prefix, so the key's
				// next requests follow it there.
				rt.ms.recent.RememberName(rt.key, eng.Name)
			}
			if rt.ep == protocol.EndpointResponses {
				// The engine keeps the response it makes (and its
				// context): a request continuing it names its id as
				// previous_response_id, and goes where it was made.
				if id, ok := protocol.ResponseID(first); ok {
					rt.ms.recent.RememberName(protocol.SessionKey(id), eng.Name)
				}
			}
			// A half-open probe succeeds as soon as the engine answers, not
			// when a long stream ends; other attempts count at their end,
			// a stream the engine breaks being a failure.
			if probe {
				h.ejectReport(rt.model, eng.Name, live, control.ResultOK, probe, nil, log)
			}
			return &attempt{idx: idx, engine: eng, resp: resp, first: first, probe: probe, start: start, n: n,
				ctx: actx, rt: rt}, nil
		}
		lat := h.opts.Now().Sub(start)
		h.opts.Observer.Outcome(rt.model, eng.Name, control.Outcome{Result: res, Latency: lat})
		code := "error"
		if resp != nil {
			code = strconv.Itoa(resp.Status)
		} else if res == control.ResultTimeout {
			code = "timeout"
		}
		if res == control.ResultCanceled {
			code = "canceled"
		}
		h.metrics.engineRequests.WithLabelValues(rt.model, eng.Name, code).Inc()
		h.ejectReport(rt.model, eng.Name, live, res, probe, err, log)
		if res == control.ResultCanceled {
			if resp != nil {
				_ = resp.Body.Close()
			}
			actx.cancel()
			rt.bound.Release(idx)
			return nil, protocol.NewAPIError(http.StatusBadGateway, protocol.ErrTypeServer, "canceled", "", errClientGone.Error())
		}
		next, cause := h.retryTo(rt, tried, idx, n)
		if cause == "" {
			h.metrics.retries.WithLabelValues(retryReason(res)).Inc()
			if g, ok := h.opts.Observer.(GuardObserver); ok {
				g.Retry(rt.model)
			}
			log.Info().Str("failed_engine", eng.Name).Str("reason", retryReason(res)).Int("attempt", n+1).
				Str("retry_engine", rt.table.Engine(next).Name).Err(err).Msg("attempt failed before the first byte; retrying")
			if resp != nil {
				_ = resp.Body.Close()
			}
			actx.cancel()
			rt.bound.Release(idx)
			idx = next
			continue
		}
		h.metrics.retrySuppressed.WithLabelValues(cause).Inc()
		if resp != nil {
			// No retry: relay the engine's own answer (a 5xx or 429).
			return &attempt{idx: idx, engine: eng, resp: resp, probe: probe, recorded: true, start: start, n: n,
				ctx: actx, rt: rt}, nil
		}
		actx.cancel()
		rt.bound.Release(idx)
		log.Warn().Err(err).Str("reason", retryReason(res)).Int("attempts", n).Str("no_retry", cause).Msg("forward failed")
		if res == control.ResultTimeout {
			msg := fmt.Sprintf("engine %q for model %q sent nothing within %v (%d attempts)", eng.Name, rt.model, timeout, n)
			if !actx.timerFired() {
				// A timeout below the attempt's deadline: connecting, or a
				// network deadline; say which rather than the deadline.
				msg = fmt.Sprintf("engine %q for model %q timed out after %v: %v (%d attempts)", eng.Name, rt.model,
					lat.Round(time.Millisecond), errString(err, resp), n)
			}
			return nil, protocol.NewAPIError(http.StatusGatewayTimeout, protocol.ErrTypeServer, "upstream_timeout", "", msg)
		}
		return nil, protocol.NewAPIError(http.StatusBadGateway, protocol.ErrTypeServer, "upstream_error", "",
			fmt.Sprintf("engine %q for model %q failed: %v (%d attempts)", eng.Name, rt.model, errString(err, resp), n))
	}
}

// passOver counts a pass over engine idx, which the router has no address
// for, and returns the key's next candidate not tried.
func (h *Handler) passOver(rt *routed, tried []int, idx int) (int, bool) {
	h.metrics.unaddressed.WithLabelValues(rt.model, rt.table.Engine(idx).Name).Inc()
	return h.nextCandidate(rt, tried, idx)
}

// noEngineError is the answer when no engine of model can be reached.
func noEngineError(model string) *protocol.APIError {
	return protocol.NewAPIError(http.StatusServiceUnavailable, protocol.ErrTypeUnavailable, "no_engine_available", "",
		fmt.Sprintf("no engine is available for model %q", model))
}

func errString(err error, resp *upstream.Response) string {
	if err != nil {
		return err.Error()
	}
	if resp != nil {
		return "status " + strconv.Itoa(resp.Status)
	}
	return "unknown error"
}

// readFirst reads until at least one byte or an error.
func readFirst(r io.Reader, buf []byte) (int, error) {
	for {
		k, err := r.Read(buf)
		if k > 0 || err != nil {
			return k, err
		}
	}
}

// retryTo decides whether attempt n, which failed on engine failed, is
// retried: it returns the next engine, or the cause of no retry
// ("attempts", "no_candidate" or "budget").
func (h *Handler) retryTo(rt *routed, tried []int, failed, n int) (int, string) {
	if n >= h.prot.MaxAttempts {
		return -1, "attempts"
	}
	next, ok := h.nextCandidate(rt, tried, failed)
	if !ok {
		return -1, "no_candidate"
	}
	if !h.budget.Take() {
		return -1, "budget"
	}
	return next, ""
}

// nextCandidate returns the key's next candidate for rt (see RetryCandidates.Next).
func (h *Handler) nextCandidate(rt *routed, tried []int, failed int) (int, bool) {
	c := RetryCandidates{Model: rt.model, Table: rt.table, Guard: rt.bound, Key: rt.key, Spare: rt.spare, Regions: h.opts.Regions}
	return c.Next(tried, failed)
}

// RetryCandidates are the engines a request may be retried on: its key's
// candidates in its table, under the guard that skips engines, and the
// snapshot's spare engines of weight zero.
type RetryCandidates struct {
	Model string
	Table *selection.Table
	Guard selection.Guard
	Key   uint64
	// Spare are the snapshot's engines of weight zero, nearest first (Figures.Spare).
	Spare []string
	// Regions gives engines' regions (nil: none known).
	Regions RegionResolver
}

// Next returns the key's next candidate engine not yet tried and not
// skipped: first in the failed engine's region (the key's candidates by
// weight, Table.Candidates, then the snapshot's spare engines of weight
// zero), then elsewhere (candidates by weight, then spare engines nearest
// first). Spare engines let a request leave a region whose planned engines
// all fail before the next snapshot moves the cluster's traffic.
func (c *RetryCandidates) Next(tried []int, failed int) (int, bool) {
	var cbuf [16]int
	cands := c.Table.Candidates(c.Key, cbuf[:0])
	usable := func(j int) bool {
		for _, x := range tried {
			if x == j {
				return false
			}
		}
		return !c.Guard.Down(j)
	}
	if c.Regions != nil {
		if region := c.Regions.Region(c.Model, c.Table.Engine(failed).Name); region != "" {
			inRegion := func(j int) bool { return c.Regions.Region(c.Model, c.Table.Engine(j).Name) == region }
			for _, j := range cands {
				if usable(j) && inRegion(j) {
					return j, true
				}
			}
			if j, ok := spareEngine(c.Table, c.Spare, func(j int) bool { return usable(j) && inRegion(j) }); ok {
				return j, true
			}
		}
	}
	for _, j := range cands {
		if usable(j) {
			return j, true
		}
	}
	return spareEngine(c.Table, c.Spare, usable)
}

// spareEngine returns the first of spare (engine names) in t that ok accepts.
func spareEngine(t *selection.Table, spare []string, ok func(j int) bool) (int, bool) {
	for _, name := range spare {
		if j, in := t.Index(name); in && ok(j) {
			return j, true
		}
	}
	return -1, false
}

// ejectReport feeds an attempt's result to the engine's ejection state
// (EngineLive.Report) and logs and exports changes.
func (h *Handler) ejectReport(model, engine string, live *EngineLive, res control.Result, probe bool, cause error, log *reqLog) {
	ev, d, fails := live.Report(res, probe, h.opts.Now(), h.prot.Eject)
	switch ev {
	case EjectStart, EjectAgain:
		h.metrics.ejected.WithLabelValues(model, engine).Set(1)
		msg := "engine ejected after consecutive failures; skipping it until a probe succeeds"
		if ev == EjectAgain {
			msg = "half-open probe failed; engine ejected again for longer"
		}
		log.Warn().Str("ejected_engine", engine).Int("consecutive_failures", fails).Str("last_failure", retryReason(res)).
			Err(cause).Dur("backoff", d).Msg(msg)
	case EjectRestored:
		h.metrics.ejected.WithLabelValues(model, engine).Set(0)
		log.Info().Str("restored_engine", engine).Msg("engine answered again; ejection lifted")
	}
}

// finishAttempt records a committed attempt's outcome after its relay.
func (h *Handler) finishAttempt(ctx context.Context, a *attempt, relayErr error, first, end time.Time, log *reqLog) {
	o := responseOutcome(ctx, a.resp.Status, relayErr, a.start, first, end)
	if a.recorded {
		return
	}
	h.opts.Observer.Outcome(a.rt.model, a.engine.Name, o)
	live := a.rt.bound.Live(a.idx)
	switch {
	case errors.Is(relayErr, errEngineBroke) && ctx.Err() == nil && a.resp.Status < 300:
		h.ejectReport(a.rt.model, a.engine.Name, live, o.Result, false, relayErr, log)
	case a.resp.Status >= 400:
		// An error answer relayed as it is: its class decides (a client
		// error is neutral, another 4xx a failure); a probe's was judged
		// when it was committed.
		if !a.probe {
			h.ejectReport(a.rt.model, a.engine.Name, live, o.Result, false, nil, log)
		}
	case relayErr == nil && !a.probe:
		h.ejectReport(a.rt.model, a.engine.Name, live, control.ResultOK, false, nil, log)
	}
}

// ongoingSteps is how many decode steps of queue beyond its class's the
// capacity allotment lets a sheddable or standard request of an ongoing
// conversation add: one whose session id or user this router has routed
// before (RecentKeys). When the bound sheds, new conversations go first,
// so that one in progress is not cut off between two of its turns.
const ongoingSteps = 1

// ongoing reports whether a request's key names a conversation this
// router has routed before: a session id or user field (not a prompt
// prefix, which many conversations share) that rk remembers.
func ongoing(src protocol.KeySource, key uint64, rk *selection.RecentKeys) bool {
	if rk == nil || (src != protocol.KeySession && src != protocol.KeyUser) {
		return false
	}
	return rk.Seen(key)
}
