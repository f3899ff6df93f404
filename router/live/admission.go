package live

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
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

// WithDefaults returns o with every zero field set to its default.
func (o ProtectionOptions) WithDefaults() ProtectionOptions {
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

// RegionResolver gives engines' regions; control.Signals implements it. Retries try
// engines in the failed engine's region first.
type RegionResolver interface {
	// Region returns the engine's region, "" when unknown.
	Region(model, engine string) string
}

// admissionUtilisation is the predicted utilisation from which local
// admission control applies when the snapshot sheds nothing.
const admissionUtilisation = 0.9

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
	return &Admission{prot: prot.WithDefaults()}
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
