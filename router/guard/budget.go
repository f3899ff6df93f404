package guard

import (
	"math"
	"sync"
	"time"
)

// Defaults of BudgetOptions.
const (
	DefaultBudgetRatio     = 0.2
	DefaultBudgetKnee      = 0.5
	DefaultBudgetFloorRate = 1.0
	DefaultBudgetMaxTokens = 10.0
)

// BudgetOptions tunes the router-wide retry budget. The zero value selects
// the defaults.
type BudgetOptions struct {
	// Ratio is r0, the tokens a client request earns while the fleet is
	// healthy (default DefaultBudgetRatio: up to one retry per five
	// requests).
	Ratio float64
	// Knee is the utilisation up to which requests earn the full Ratio
	// (default DefaultBudgetKnee).
	Knee float64
	// FloorRate is the tokens per second earned whatever the load, so that a
	// quiet or saturated router can still retry a little (default
	// DefaultBudgetFloorRate; negative: none).
	FloorRate float64
	// MaxTokens caps the stored tokens, hence a burst of retries (default
	// DefaultBudgetMaxTokens).
	MaxTokens float64
}

// WithDefaults returns o with its zero fields set to the defaults.
func (o BudgetOptions) WithDefaults() BudgetOptions {
	if o.Ratio <= 0 {
		o.Ratio = DefaultBudgetRatio
	}
	if o.Knee <= 0 || o.Knee >= 1 {
		o.Knee = DefaultBudgetKnee
	}
	switch {
	case o.FloorRate == 0:
		o.FloorRate = DefaultBudgetFloorRate
	case o.FloorRate < 0:
		o.FloorRate = 0
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = DefaultBudgetMaxTokens
	}
	return o
}

// EarnRate returns the tokens one client request earns at utilisation u:
//
//	r(u) = r0                          for u ≤ knee
//	r(u) = r0 · ((1−u)/(1−knee))²      for knee < u < 1
//	r(u) = 0                           for u ≥ 1
//
// With the defaults (r0 = 0.2, knee = 0.5): 0.2 up to half load, 0.072 at
// 0.7, 0.032 at 0.8, 0.008 at 0.9, nothing at saturation.
func (o BudgetOptions) EarnRate(u float64) float64 {
	o = o.WithDefaults()
	switch {
	case !(u > o.Knee):
		return o.Ratio
	case u >= 1:
		return 0
	}
	x := (1 - u) / (1 - o.Knee)
	return o.Ratio * x * x
}

// RetryBudget is a router-wide token bucket for retries: every client
// request earns EarnRate(u) tokens, every retry costs one, and FloorRate
// tokens a second accrue whatever happens; at most MaxTokens are stored.
// It starts with one token. It is safe for concurrent use.
type RetryBudget struct {
	opts   BudgetOptions
	now    func() time.Time
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// NewRetryBudget returns a budget with opts; now is the clock (nil:
// time.Now).
func NewRetryBudget(opts BudgetOptions, now func() time.Time) *RetryBudget {
	if now == nil {
		now = time.Now
	}
	opts = opts.WithDefaults()
	return &RetryBudget{opts: opts, now: now, tokens: math.Min(1, opts.MaxTokens), last: now()}
}

// accrueLocked adds the floor's tokens since the last call.
func (b *RetryBudget) accrueLocked() {
	now := b.now()
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = math.Min(b.opts.MaxTokens, b.tokens+dt*b.opts.FloorRate)
	}
	b.last = now
}

// Earn credits one client request at utilisation u.
func (b *RetryBudget) Earn(u float64) {
	r := b.opts.EarnRate(u)
	b.mu.Lock()
	b.accrueLocked()
	b.tokens = math.Min(b.opts.MaxTokens, b.tokens+r)
	b.mu.Unlock()
}

// Take spends one token for a retry and reports whether there was one.
func (b *RetryBudget) Take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrueLocked()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Tokens returns the stored tokens.
func (b *RetryBudget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrueLocked()
	return b.tokens
}

// ampBuckets and ampBucket make the amplification window: 10 one-second
// buckets.
const (
	ampBuckets = 10
	ampBucket  = time.Second
)

// AmpWindow counts client requests and upstream attempts over a sliding
// window of ampBuckets × ampBucket.
type AmpWindow struct {
	mu       sync.Mutex
	now      func() time.Time
	epoch    int64 // bucket number of head
	head     int
	requests [ampBuckets]int64
	attempts [ampBuckets]int64
}

// NewAmpWindow returns an empty amplification window reading the clock now.
func NewAmpWindow(now func() time.Time) *AmpWindow { return &AmpWindow{now: now} }

func (w *AmpWindow) advanceLocked() int {
	n := w.now().UnixNano() / int64(ampBucket)
	if d := n - w.epoch; d > 0 {
		if d > ampBuckets {
			d = ampBuckets
		}
		for i := int64(0); i < d; i++ {
			w.head = (w.head + 1) % ampBuckets
			w.requests[w.head], w.attempts[w.head] = 0, 0
		}
		w.epoch = n
	}
	return w.head
}

// Add counts client requests and upstream attempts now.
func (w *AmpWindow) Add(requests, attempts int64) {
	w.mu.Lock()
	i := w.advanceLocked()
	w.requests[i] += requests
	w.attempts[i] += attempts
	w.mu.Unlock()
}

// Ratio returns attempts per client request over the window, 1 when idle.
func (w *AmpWindow) Ratio() float64 {
	w.mu.Lock()
	w.advanceLocked()
	var r, a int64
	for i := range w.requests {
		r += w.requests[i]
		a += w.attempts[i]
	}
	w.mu.Unlock()
	if r == 0 {
		return 1
	}
	return float64(a) / float64(r)
}
