package guard

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Figures are the parts of a weight snapshot the router's guards use:
// the shed fractions, the demand and the predicted utilisation and latency
// of the engines the snapshot sends this cluster's traffic to. A
// SnapshotStore attaches them to Info while its snapshot is fresh; they are
// immutable.
type Figures struct {
	// ShedFraction is the fraction of the cluster's demand to shed, 0..1.
	ShedFraction float64
	// ShedByPriority, when HasShedByPriority, is the fraction of each
	// class's demand to shed, indexed by Priority.
	ShedByPriority [protocol.NumPriorities]float64
	// HasShedByPriority says whether the snapshot carried ShedByPriority.
	HasShedByPriority bool
	// DemandRPS is the cluster's demand the snapshot was computed for.
	DemandRPS float64
	// Utilisation is the weight-averaged predicted utilisation of the
	// snapshot's engines (0 when the snapshot carries none).
	Utilisation float64
	// Latency is the weight-averaged predicted latency of the snapshot's
	// engines (0 when the snapshot carries none).
	Latency time.Duration
	// Spare lists the snapshot's engines of weight zero — eligible for the
	// cluster, but not planned to serve it — nearest first: by the
	// snapshot's predicted latency to them (network plus engine-side), those
	// without one last, ties by name. Retries and requests whose planned
	// engines are all skipped may go to them (see Handler).
	Spare []string
	// LatencyMs is the snapshot's predicted latency (network plus
	// engine-side) of each engine it names, ms, where finite and not
	// negative; the snapshot's map, not to be modified.
	LatencyMs map[string]float64
	// Unplanned says the snapshot names no engine at all for the cluster
	// (it then sheds everything): no engine of the model is up, or none
	// has a network latency the optimizer knows from this cluster. Such a
	// shed is not an overload, and its answer says so.
	Unplanned bool
}

// FiguresOf extracts the guards' figures from snap.
func FiguresOf(snap *messages.WeightSnapshot) *Figures {
	f := &Figures{ShedFraction: shedClamp(snap.ShedFraction), DemandRPS: math.Max(0, snap.DemandRPS)}
	if len(snap.ShedByPriority) > 0 {
		for p := protocol.Priority(0); p < protocol.NumPriorities; p++ {
			if v := shedClamp(snap.ShedByPriority[p.String()]); v > 0 {
				f.ShedByPriority[p] = v
				f.HasShedByPriority = true
			}
		}
	}
	f.Unplanned = len(snap.Weights) == 0 && f.ShedFraction >= 1
	f.LatencyMs = snap.LatencyMs
	var wsum, usum, lsum, lw float64
	for name, w := range snap.Weights {
		if !(w > 0) {
			continue
		}
		wsum += w
		usum += w * clamp01orMore(snap.Utilisation[name])
		if l, ok := snap.LatencyMs[name]; ok && l > 0 && !math.IsInf(l, 0) {
			lsum += w * l
			lw += w
		}
	}
	if wsum > 0 {
		f.Utilisation = usum / wsum
	}
	if lw > 0 {
		f.Latency = time.Duration(lsum / lw * float64(time.Millisecond))
	}
	for name, w := range snap.Weights {
		if !(w > 0) {
			f.Spare = append(f.Spare, name)
		}
	}
	lat := func(name string) float64 {
		if l, ok := snap.LatencyMs[name]; ok && l >= 0 && !math.IsInf(l, 0) && !math.IsNaN(l) {
			return l
		}
		return math.Inf(1)
	}
	sort.Slice(f.Spare, func(a, b int) bool {
		la, lb := lat(f.Spare[a]), lat(f.Spare[b])
		if la != lb {
			return la < lb
		}
		return f.Spare[a] < f.Spare[b]
	})
	return f
}

// EngineLatency returns the snapshot's predicted latency of the named
// engine (network plus engine-side) and whether it predicts a usable one.
func (f *Figures) EngineLatency(engine string) (time.Duration, bool) {
	l, ok := f.LatencyMs[engine]
	if !ok || !(l >= 0) || math.IsInf(l, 0) {
		return 0, false
	}
	return time.Duration(l * float64(time.Millisecond)), true
}

// minShed is the smallest shed fraction taken as shedding: a solver's
// rounding (1e-16 of a cluster's demand) is not an instruction to shed, nor a
// sign that the fleet is at its limit.
const minShed = 1e-6

// shedClamp is clamp01 with fractions below minShed read as none.
func shedClamp(v float64) float64 {
	if v < minShed {
		return 0
	}
	return clamp01(v)
}

func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return math.Min(v, 1)
}

// clamp01orMore keeps utilisations above 1 (an overloaded prediction) but
// drops negative and non-finite ones.
func clamp01orMore(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 0
	}
	return math.Min(v, 10)
}

// ShedFractions returns the fraction of each priority class to shed for a
// cluster-wide shed fraction s and the observed share mix of each class
// (summing to 1, or all zero when unknown). Classes are shed in order,
// sheddable first: a class is shed in part only when every lower class is
// shed in full. A class not observed is shed in full as soon as its turn
// comes, so a request of it that arrives is shed before any of a higher
// class. With no observations the demand is taken to be all standard.
func ShedFractions(s float64, mix [protocol.NumPriorities]float64) [protocol.NumPriorities]float64 {
	var out [protocol.NumPriorities]float64
	s = clamp01(s)
	if s == 0 {
		return out
	}
	if mix == ([protocol.NumPriorities]float64{}) {
		mix[protocol.PriorityStandard] = 1
	}
	left := s
	for p := protocol.Priority(0); p < protocol.NumPriorities; p++ {
		if left <= 1e-12 {
			break
		}
		if mix[p] <= 0 {
			out[p] = 1
			continue
		}
		f := math.Min(1, left/mix[p])
		out[p] = f
		left -= f * mix[p]
	}
	return out
}

// KeyUnit maps an affinity key to [0, 1) with a hash independent of the
// key's slot, so that shedding the keys below a fraction spreads over all
// engines and a key is always on the same side of a fixed fraction.
func KeyUnit(key uint64) float64 {
	return float64(selection.Mix64(key^0x6a09e667f3bcc909)>>11) / (1 << 53)
}

// ShedReason says why a request was shed, the reason label of
// switchyard_router_shed_total.
type ShedReason string

// Shed reasons.
const (
	// ShedSnapshot: the snapshot's shed fraction for the request's class
	// covers its key.
	ShedSnapshot ShedReason = "snapshot"
	// ShedAdmission: the router's in-flight requests are over its allotment.
	ShedAdmission ShedReason = "admission"
	// ShedUnplanned: the snapshot plans no engine for the cluster
	// (Figures.Unplanned).
	ShedUnplanned ShedReason = "unplanned"
)

// AdmissionFactor scales the allotment for class p: sheddable requests are
// admitted up to 80% of it, standard ones up to all of it, critical ones up
// to 125%, so that a burst sheds sheddable traffic first and critical last.
func AdmissionFactor(p protocol.Priority) float64 {
	switch p {
	case protocol.PrioritySheddable:
		return 0.8
	case protocol.PriorityCritical:
		return 1.25
	}
	return 1
}

// Allotment returns the in-flight requests this router may hold for a
// model under f: by Little's law, the router's share of the demand the
// snapshot serves times its predicted latency, plus slack:
//
//	m = DemandRPS·(1−ShedFraction)/routers · Latency
//	max(minInFlight, (1+slack)·m + 4·√m)
//
// It returns 0 (no limit) when f is nil or carries no latency or demand.
func Allotment(f *Figures, routers int, slack float64, minInFlight int) float64 {
	if f == nil || f.Latency <= 0 || f.DemandRPS <= 0 {
		return 0
	}
	if routers < 1 {
		routers = 1
	}
	lam := f.DemandRPS * (1 - f.ShedFraction) / float64(routers)
	// With Poisson arrivals the number in flight is itself Poisson around
	// its mean m = λ·W (an M/G/∞ count): allow four standard deviations of
	// that burstiness before the slack, so that steady demand the snapshot
	// plans for is never shed.
	m := lam * f.Latency.Seconds()
	return math.Max(float64(minInFlight), (1+slack)*m+4*math.Sqrt(m))
}

// QueueSteps is how many decode steps' worth of requests beyond the
// engines' batch slots the capacity allotment (CapacityAllotment) lets a
// request of class p find in flight: none for a sheddable request, three
// eighths of a step for a standard one, twenty for a critical one.
//
// The first two set the trade between the served-throughput and
// admitted-TTFT rows of the reliability scenario's overload:
// a request joins its engine's batch at a step boundary, so a slot freed at
// a boundary stays empty for a step unless a request already waits in the
// engine's queue there, and a router that keeps the queues empty serves at
// most T/(T+1) of the engines' capacity for T-token answers; each request it
// lets queue fills such a slot but waits for a completion, a step or more.
// At the engines' capacity a step's arrivals are a step's completions, so
// three eighths of a step of standard requests wait about that long.
// Measured on 2 engines of 64 slots with 100 ms steps (sheddable/standard
// steps, runs alternated): 0/0.25 served 95.1–96.0% at an admitted TTFT p99
// of 1.49–1.79× the unloaded one (7 runs), 0/0.375 96.2–96.5% at
// 1.52–1.83× (10 runs), 0/0.5 96.2–97.0% at 1.66–1.96× (over 20 runs),
// 0.25/0.75 97.5–97.7% at 1.90–2.09× (3 runs); three eighths keeps both
// rows furthest from their limits. Critical requests are shed by the
// allotment only behind a backlog of twenty steps (two seconds on those
// engines), so that none is shed while sheddable requests are served.
func QueueSteps(p protocol.Priority) float64 {
	switch p {
	case protocol.PrioritySheddable:
		return 0
	case protocol.PriorityCritical:
		return 20
	}
	return 0.375
}

// CapacityAllotment returns the in-flight requests of class p this router
// may hold for a model while the snapshot f sheds: its share of the served
// rate the snapshot plans (λ = DemandRPS·(1−ShedFraction)/routers, the
// engines' capacity) times the time a request holds a batch slot at that
// rate, slot seconds, plus QueueSteps(p) decode steps of step seconds,
//
//	λ · (slot + QueueSteps(p)·step)
//
// at least minInFlight. Unlike Allotment it does not rest on the latency
// the snapshot predicts, which the optimizer's queue curve puts at several
// times a continuous-batching engine's real latency near its capacity (5 s
// against 1 s in the reliability scenario, so that a backlog built before
// the snapshot caught up with a rise in demand was allotted and never
// drained): at the engines' capacity the requests in flight that are not
// queued are their batch slots, and what is allotted beyond them waits
// about QueueSteps steps. It returns 0 (no limit) when f is nil or does not shed, or slot
// is not positive.
func CapacityAllotment(f *Figures, routers int, slot, step float64, p protocol.Priority, minInFlight int) float64 {
	return CapacityAllotmentSteps(f, routers, slot, step, QueueSteps(p), minInFlight)
}

// CapacityAllotmentSteps is CapacityAllotment with steps decode steps of queue.
func CapacityAllotmentSteps(f *Figures, routers int, slot, step, steps float64, minInFlight int) float64 {
	if f == nil || !(f.ShedFraction > 0 || f.HasShedByPriority) || !(slot > 0) || f.DemandRPS <= 0 {
		return 0
	}
	lam := f.DemandRPS * (1 - f.ShedFraction) / float64(max(routers, 1))
	return math.Max(float64(minInFlight), lam*(slot+steps*math.Max(0, step)))
}

// mixWindow is the length of one window of the priority mix; the mix spans
// the current and the previous window.
const mixWindow = 10 * time.Second

// PriorityMix counts one model's requests by class over a sliding window,
// to split a snapshot's cluster-wide shed fraction over the classes.
type PriorityMix struct {
	mu    sync.Mutex
	first time.Time // the first request seen
	start time.Time
	cur   [protocol.NumPriorities]float64
	prev  [protocol.NumPriorities]float64
}

// Add counts one request of class p at now.
func (m *PriorityMix) Add(p protocol.Priority, now time.Time) {
	m.mu.Lock()
	if m.first.IsZero() {
		m.first = now
	}
	m.rollLocked(now)
	m.cur[p]++
	m.mu.Unlock()
}

// Rate returns this router's request rate for the model over the window,
// req/s, counted over at least one whole window, so that a burst at a fresh
// router reads as a tenth of its size, not as its size per second.
func (m *PriorityMix) Rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.first.IsZero() {
		return 0
	}
	m.rollLocked(now)
	total := 0.0
	for p := range m.cur {
		total += m.cur[p] + m.prev[p]
	}
	span := min(now.Sub(m.first), mixWindow+now.Sub(m.start))
	return total / math.Max(span.Seconds(), mixWindow.Seconds())
}

func (m *PriorityMix) rollLocked(now time.Time) {
	switch d := now.Sub(m.start); {
	case m.start.IsZero() || d >= 2*mixWindow:
		m.prev, m.cur, m.start = [protocol.NumPriorities]float64{}, [protocol.NumPriorities]float64{}, now
	case d >= mixWindow:
		m.prev, m.cur = m.cur, [protocol.NumPriorities]float64{}
		m.start = m.start.Add(mixWindow)
	}
}

// minMixSamples is how many requests the mix must have seen before it is
// trusted; until then the demand counts as all standard.
const minMixSamples = 20

// Shares returns each class's share of the window's requests (all zero
// when fewer than minMixSamples were seen).
func (m *PriorityMix) Shares(now time.Time) [protocol.NumPriorities]float64 {
	m.mu.Lock()
	m.rollLocked(now)
	var out [protocol.NumPriorities]float64
	total := 0.0
	for p := range out {
		out[p] = m.cur[p] + m.prev[p]
		total += out[p]
	}
	m.mu.Unlock()
	if total < minMixSamples {
		return [protocol.NumPriorities]float64{}
	}
	if total > 0 {
		for p := range out {
			out[p] /= total
		}
	}
	return out
}

// DefaultSlotHeadroom is ProtectionOptions.SlotHeadroom's default: at 150%
// of capacity (a shed fraction of 1/3) the snapshot then sheds 1/6 of the
// demand by key and the capacity allotment the rest, sheddable first.
const DefaultSlotHeadroom = 0.25

// RelaxedShed returns the shed fraction a router enforces for a snapshot's
// shed fraction s when it bounds its requests to the engines' batch slots:
// it lets through 1+headroom times the share 1−s the snapshot serves,
//
//	max(0, 1 − (1+headroom)·(1−s)),
//
// so that at 150% of capacity (s = 1/3) and headroom 0.25 it sheds 1/6 of
// the demand by key and the slot bound the rest.
func RelaxedShed(s, headroom float64) float64 {
	s = clamp01(s)
	if s == 0 || !(headroom > 0) {
		return s
	}
	return shedClamp(1 - (1+headroom)*(1-s))
}
