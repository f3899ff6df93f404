// Package batching is the continuous-batching step model of an inference
// engine, shared by the engine simulator (services/enginesim, in real time),
// the fleet simulator (sim, in virtual time) and bench/slotmodel.
//
// An engine holds a FIFO queue and a batch of at most MaxBatch running
// requests, and runs one step at a time. At a step boundary it admits
// waiting requests in arrival order while a slot is free and the caller's
// admission check (its KV cache) accepts the head of the queue. When it
// admitted any, the step is a prefill of them alone: Cost.PrefillMs of
// their uncached prompt tokens, at the end of which each has its first
// token; decoding pauses meanwhile. Otherwise, with requests running, the
// step is a decode step of Cost.DecodeMs, which gives every running request
// one token. A request leaves the batch with its last token, at the end of
// the step that produced it, and frees its slot for the next boundary.
//
// Batch is a pure data structure: it reads no clock. The caller starts a
// step, waits for the step's duration in its own time (a timer, or an event
// in a discrete-event simulation, scaled by the engine's speed), and ends
// it.
package batching

// Cost is the step-time model of an engine, at speed 1.
type Cost struct {
	// PrefillMsPerToken is the prefill time per prompt token the step
	// computes (not served from a cached prefix), ms.
	PrefillMsPerToken float64
	// TBTBaseMs is a decode step with one running request, ms.
	TBTBaseMs float64
	// TBTPerRequestMs is what each further running request adds to a decode step, ms.
	TBTPerRequestMs float64
	// TBTPerKTokenMs is what every 1,000 tokens of context held by the running
	// requests add to a decode step, ms.
	TBTPerKTokenMs float64
}

// PrefillMs returns the duration of a prefill step computing tokens prompt tokens, ms.
func (c Cost) PrefillMs(tokens int) float64 {
	return float64(tokens) * c.PrefillMsPerToken
}

// DecodeMs returns the duration of a decode step with running requests
// holding context tokens, ms (a decode step of nothing costs what one of a
// single request does).
func (c Cost) DecodeMs(running int, context int64) float64 {
	return c.TBTBaseMs + c.TBTPerRequestMs*float64(max(running, 1)-1) + c.TBTPerKTokenMs*float64(context)/1000
}

// Capacity returns the sustainable request rate, req/s, of an engine that
// keeps batch requests running, each of prompt tokens (none cached) and
// output tokens: every request costs its share of prefill and output−1
// decode steps of a full batch, whose context is on average
// batch·(prompt + output/2) tokens.
func (c Cost) Capacity(batch, prompt, output int) float64 {
	b := float64(batch)
	perBatchMs := b*c.PrefillMs(prompt) + float64(output-1)*c.fullTBT(batch, prompt, output)
	return 1000 * b / perBatchMs
}

// fullTBT is the decode step of a full batch of such requests, ms.
func (c Cost) fullTBT(batch, prompt, output int) float64 {
	tbt := c.DecodeMs(batch, 0)
	if c.TBTPerKTokenMs != 0 {
		tbt += c.TBTPerKTokenMs * float64(batch) * (float64(prompt) + float64(output)/2) / 1000
	}
	return tbt
}

// PrefillWeight returns what one prompt token costs relative to one output
// token at the batch Capacity assumes: the prefill time of a token over a
// full decode step's time per running request (messages.Work's weight).
func (c Cost) PrefillWeight(batch, prompt, output int) float64 {
	return c.PrefillMsPerToken * float64(batch) / c.fullTBT(batch, prompt, output)
}

// IdleMs returns the engine-side latency of a lone request of prompt tokens
// (none cached) and output tokens on an idle engine: its prefill, then
// output−1 decode steps of one request.
func (c Cost) IdleMs(prompt, output int) float64 {
	ms := c.PrefillMs(prompt) + float64(output-1)*c.DecodeMs(1, 0)
	if c.TBTPerKTokenMs != 0 && output > 1 {
		// The k-th decode step holds prompt + k tokens of context.
		n := float64(output - 1)
		ms += c.TBTPerKTokenMs * (n*float64(prompt) + n*(n+1)/2) / 1000
	}
	return ms
}

// Phase is what an engine is doing.
type Phase uint8

// The phases of a step.
const (
	// Idle: no step in progress.
	Idle Phase = iota
	// Prefill: a prefill step of the requests admitted at its start.
	Prefill
	// Decode: a decode step of every running request.
	Decode
)

// String returns the phase's name.
func (p Phase) String() string {
	switch p {
	case Idle:
		return "idle"
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	}
	return "unknown"
}

// Step is the step Start began.
type Step struct {
	Phase Phase
	// Ms is the step's duration at speed 1, ms; 0 when Idle.
	Ms float64
}

// Admission is what the model needs to know of a request the caller admits.
type Admission struct {
	// Prefill is the prompt tokens its prefill computes: the prompt less
	// any prefix served from the cache.
	Prefill int
	// Prompt is its prompt length, tokens (below 2^31): the context it
	// holds once admitted.
	Prompt int
	// Output is the tokens it generates, the first at the end of its
	// prefill; less than 1 counts as 1.
	Output int
}

// slot is a request in the batch.
type slot[R any] struct {
	req    R
	prompt int32
	// first is the decode steps done when it was prefilled; last the decode
	// step that gives its last token.
	first, last int64
}

// Batch is one engine's queue and running batch. The zero value is not
// usable; create one with New. A Batch is not safe for concurrent use.
type Batch[R any] struct {
	cost     Cost
	maxBatch int
	queue    []R
	qhead    int
	prefill  []slot[R] // admitted by the step in progress when it is a prefill
	fin      []slot[R] // prefilled requests: a min-heap on last
	running  int
	steps    int64 // decode steps done
	context  int64
	phase    Phase
}

// New returns an empty batch of at most maxBatch running requests (at least
// one) whose steps take what cost says.
func New[R any](cost Cost, maxBatch int) *Batch[R] {
	return &Batch[R]{cost: cost, maxBatch: max(maxBatch, 1)}
}

// Enqueue adds r at the tail of the queue. It is admitted at a later step
// boundary (call Start when Phase is Idle).
func (b *Batch[R]) Enqueue(r R) { b.queue = append(b.queue, r) }

// Queued returns the number of waiting requests.
func (b *Batch[R]) Queued() int { return len(b.queue) - b.qhead }

// Running returns the number of requests in the batch, those being prefilled included.
func (b *Batch[R]) Running() int { return b.running }

// Context returns the tokens the running requests hold: each one's prompt
// from its admission on, plus the tokens it has generated.
func (b *Batch[R]) Context() int64 { return b.context }

// Phase returns the phase of the step in progress, Idle between steps.
func (b *Batch[R]) Phase() Phase { return b.phase }

// Start begins the next step; there must be none in progress (Phase is
// Idle). It admits requests from the head of the queue while a slot is
// free and admit accepts them; admit is told whether the batch is empty so
// far (nothing running and nothing admitted by this step), where a caller
// may admit a request its cache cannot otherwise hold. Start returns the
// prefill of what it admitted, else a decode step when requests run, else
// Idle. Start during a step is the caller's bug and panics.
func (b *Batch[R]) Start(admit func(r R, alone bool) (Admission, bool)) Step {
	if b.phase != Idle {
		panic("batching: Start during a " + b.phase.String() + " step")
	}
	b.prefill = b.prefill[:0]
	tokens := 0
	for b.Queued() > 0 && b.running < b.maxBatch {
		r := b.queue[b.qhead]
		a, ok := admit(r, b.running == 0)
		if !ok {
			break
		}
		var zero R
		b.queue[b.qhead] = zero
		b.qhead++
		b.running++
		b.context += int64(a.Prompt)
		tokens += a.Prefill
		b.prefill = append(b.prefill, slot[R]{req: r, last: int64(max(a.Output, 1)), prompt: int32(a.Prompt)})
	}
	switch {
	case b.qhead == len(b.queue):
		b.queue, b.qhead = b.queue[:0], 0
	case b.qhead > 1024 && b.qhead*2 > len(b.queue):
		n := copy(b.queue, b.queue[b.qhead:])
		clear(b.queue[n:])
		b.queue, b.qhead = b.queue[:n], 0
	}
	switch {
	case len(b.prefill) > 0:
		b.phase = Prefill
		return Step{Phase: Prefill, Ms: b.cost.PrefillMs(tokens)}
	case b.running > 0:
		b.phase = Decode
		return Step{Phase: Decode, Ms: b.cost.DecodeMs(b.running, b.context)}
	}
	return Step{Phase: Idle}
}

// End completes the step in progress; without one (Idle, or after Clear) it
// does nothing. At the end of a prefill, first is called for each request
// it prefilled, in admission order; at the end of a decode step every
// running request has one more token (see Decoding). Each request that
// produced its last token has left the batch when done is called for it:
// right after first for a one-token request; at a decode step in an order
// that depends only on what the batch was given, so that runs repeat.
func (b *Batch[R]) End(first, done func(r R)) {
	switch b.phase {
	case Prefill:
		for _, s := range b.prefill {
			b.context++
			first(s.req)
			if s.last <= 1 {
				b.leave(s, 1)
				done(s.req)
				continue
			}
			s.first = b.steps
			s.last += b.steps - 1
			b.push(s)
		}
		clear(b.prefill)
		b.prefill = b.prefill[:0]
	case Decode:
		b.steps++
		b.context += int64(b.running)
		for len(b.fin) > 0 && b.fin[0].last <= b.steps {
			s := b.pop()
			b.leave(s, int(s.last-s.first)+1)
			done(s.req)
		}
	}
	b.phase = Idle
}

// leave takes s, which generated tokens, out of the batch.
func (b *Batch[R]) leave(s slot[R], generated int) {
	b.running--
	b.context -= int64(s.prompt) + int64(generated)
}

// Decoding calls f for every request past its prefill with the tokens it
// has generated, in no particular order.
func (b *Batch[R]) Decoding(f func(r R, generated int)) {
	for _, s := range b.fin {
		f(s.req, int(b.steps-s.first)+1)
	}
}

// Drop removes, between steps, every queued and running request for which
// drop returns true (it is told whether the request is running), as when
// their clients give up. Drop during a step is the caller's bug and panics.
func (b *Batch[R]) Drop(drop func(r R, running bool) bool) {
	if b.phase != Idle {
		panic("batching: Drop during a " + b.phase.String() + " step")
	}
	q := b.queue[:b.qhead]
	for _, r := range b.queue[b.qhead:] {
		if !drop(r, false) {
			q = append(q, r)
		}
	}
	clear(b.queue[len(q):])
	b.queue = q
	fin := b.fin[:0]
	for _, s := range b.fin {
		if drop(s.req, true) {
			b.leave(s, int(b.steps-s.first)+1)
			continue
		}
		fin = append(fin, s)
	}
	clear(b.fin[len(fin):])
	b.fin = fin
	for i := len(b.fin)/2 - 1; i >= 0; i-- {
		b.down(i)
	}
}

// Clear empties the batch and the queue, as an engine failure does, and
// ends the step in progress. It calls lost for every request: first the
// running ones that have their first token (started), then those in a
// prefill step in progress, then the queued ones in arrival order.
func (b *Batch[R]) Clear(lost func(r R, started bool)) {
	for len(b.fin) > 0 {
		lost(b.pop().req, true)
	}
	for _, s := range b.prefill {
		lost(s.req, false)
	}
	clear(b.prefill)
	b.prefill = b.prefill[:0]
	for _, r := range b.queue[b.qhead:] {
		lost(r, false)
	}
	clear(b.queue)
	b.queue, b.qhead = b.queue[:0], 0
	b.running, b.context, b.steps, b.phase = 0, 0, 0, Idle
}

func (b *Batch[R]) push(s slot[R]) {
	b.fin = append(b.fin, s)
	i := len(b.fin) - 1
	for i > 0 {
		p := (i - 1) / 2
		if b.fin[p].last <= b.fin[i].last {
			break
		}
		b.fin[i], b.fin[p] = b.fin[p], b.fin[i]
		i = p
	}
}

func (b *Batch[R]) pop() slot[R] {
	top := b.fin[0]
	n := len(b.fin) - 1
	b.fin[0] = b.fin[n]
	var zero slot[R]
	b.fin[n] = zero
	b.fin = b.fin[:n]
	b.down(0)
	return top
}

// down restores the heap below i.
func (b *Batch[R]) down(i int) {
	n := len(b.fin)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && b.fin[r].last < b.fin[l].last {
			m = r
		}
		if b.fin[i].last <= b.fin[m].last {
			break
		}
		b.fin[i], b.fin[m] = b.fin[m], b.fin[i]
		i = m
	}
}
