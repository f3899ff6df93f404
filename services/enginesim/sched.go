package enginesim

import (
	"context"
	"errors"
	"time"
)

type reqState int

const (
	stateQueued reqState = iota
	stateRunning
	stateDone
	stateAborted
)

// errCrashed ends requests lost in a crash; errClosing those cut short by Close.
var (
	errCrashed = errors.New("enginesim: engine crashed")
	errClosing = errors.New("enginesim: engine shutting down")
)

// request is one inference request inside the scheduler. Fields below mu are
// guarded by Engine.mu.
type request struct {
	prompt int
	// cached is how many leading prompt tokens the prefix cache holds
	// (with Options.KVEvents): their prefill is skipped, as in vLLM.
	cached  int
	maxOut  int
	arrived time.Time
	// queued is when the request entered the queue (after any added latency).
	queued time.Time
	// notify gets a non-blocking send whenever the request makes progress.
	notify chan struct{}
	// cancelled is set by the client side; the scheduler drops the request at
	// the next step boundary.
	cancelled bool

	state     reqState
	generated int
	firstAt   time.Time
	lastAt    time.Time
}

func newRequest(prompt, maxOut int, arrived time.Time) *request {
	return &request{prompt: prompt, maxOut: maxOut, arrived: arrived, notify: make(chan struct{}, 1)}
}

func (r *request) poke() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (e *Engine) pokeScheduler() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// submit queues r; it fails when the engine is closing or crashed.
func (e *Engine) submit(r *request) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return errClosing
	}
	if e.failure.Crashed {
		return errCrashed
	}
	r.queued = time.Now()
	e.queue = append(e.queue, r)
	e.pokeScheduler()
	return nil
}

// cancel marks r as abandoned by its client.
func (e *Engine) cancel(r *request) {
	e.mu.Lock()
	r.cancelled = true
	e.mu.Unlock()
	e.pokeScheduler()
}

// wait follows r until it is done, calling emit with each new range of tokens
// [from, to) as they are generated. It returns nil when r is done, ctx.Err()
// when the client gives up, or errCrashed, errClosing, or emit's error.
func (e *Engine) wait(ctx context.Context, r *request, emit func(from, to int) error) error {
	sent := 0
	for {
		select {
		case <-r.notify:
		case <-ctx.Done():
			e.cancel(r)
			return ctx.Err()
		case <-e.quit:
			return errClosing
		}
		e.mu.Lock()
		gen, st := r.generated, r.state
		e.mu.Unlock()
		if st == stateAborted {
			return errCrashed
		}
		if gen > sent && emit != nil {
			if err := emit(sent, gen); err != nil {
				e.cancel(r)
				return err
			}
		}
		sent = gen
		if st == stateDone {
			return nil
		}
	}
}

// abortAllLocked drops every queued and running request, as a crash does.
func (e *Engine) abortAllLocked() {
	for _, r := range e.queue {
		r.state = stateAborted
		r.poke()
	}
	for _, r := range e.running {
		r.state = stateAborted
		r.poke()
	}
	e.queue, e.running, e.kvReserved = nil, nil, 0
}

// reapLocked drops cancelled requests from the queue and the batch.
func (e *Engine) reapLocked() {
	q := e.queue[:0]
	for _, r := range e.queue {
		if r.cancelled {
			r.state = stateAborted
			continue
		}
		q = append(q, r)
	}
	clear(e.queue[len(q):])
	e.queue = q
	run := e.running[:0]
	for _, r := range e.running {
		if r.cancelled {
			r.state = stateAborted
			e.kvReserved -= r.prompt + r.maxOut
			continue
		}
		run = append(run, r)
	}
	clear(e.running[len(run):])
	e.running = run
}

// admitLocked moves requests from the queue into the batch while a slot is
// free and the KV cache can hold them, in arrival order.
func (e *Engine) admitLocked() []*request {
	var admitted []*request
	for len(e.queue) > 0 && len(e.running) < e.opts.MaxBatch {
		r := e.queue[0]
		need := r.prompt + r.maxOut
		if e.kvReserved+need > e.opts.KVTokens {
			break
		}
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.kvReserved += need
		r.state = stateRunning
		e.running = append(e.running, r)
		admitted = append(admitted, r)
	}
	if len(e.queue) == 0 {
		e.queue = nil // let the backing array go
	}
	return admitted
}

// finishLocked retires r after its last token.
func (e *Engine) finishLocked(r *request, now time.Time) {
	r.state = stateDone
	e.kvReserved -= r.prompt + r.maxOut
	e.stats.completed(r, now)
	e.metrics.vllm.finished(r, now)
	if r.generated > 1 {
		e.metrics.tbt.Observe(r.lastAt.Sub(r.firstAt).Seconds() / float64(r.generated-1))
	}
}

// maxLag is how late a step may start and still be scheduled from the ideal
// end of the previous one (which keeps timer lateness from adding up).
const maxLag = 2 * time.Millisecond

// schedule is the engine's one scheduler goroutine: it alternates prefill and
// decode steps on a timer until quit closes.
func (e *Engine) schedule() {
	defer e.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var lastEnd time.Time
	for {
		e.mu.Lock()
		e.reapLocked()
		admitted := e.admitLocked()
		var ms float64
		prefill := len(admitted) > 0
		if prefill {
			tokens := 0
			for _, r := range admitted {
				// vLLM computes at least the last prompt token even on a full hit.
				tokens += max(1, r.prompt-r.cached)
			}
			ms = float64(tokens) * e.opts.PrefillMsPerToken
		} else if len(e.running) > 0 {
			ms = e.opts.tbtMs(len(e.running))
		}
		ms *= e.opts.TimeScale / e.failure.factor()
		e.mu.Unlock()

		if ms == 0 {
			lastEnd = time.Time{} // after idling, the next step starts when it is scheduled
			select {
			case <-e.wake:
				continue
			case <-e.quit:
				return
			}
		}
		now := time.Now()
		start := lastEnd
		if lastEnd.IsZero() || now.Sub(lastEnd) > maxLag {
			start = now
		}
		for _, r := range admitted {
			// A prefill cannot start before its request was there.
			if r.queued.After(start) {
				start = r.queued
			}
		}
		end := start.Add(time.Duration(ms * float64(time.Millisecond)))
		timer.Reset(time.Until(end))
		select {
		case <-timer.C:
		case <-e.quit:
			return
		}
		lastEnd = end

		e.mu.Lock()
		now = time.Now()
		progressed := e.running
		if prefill {
			progressed = admitted
		}
		finished := false
		for _, r := range progressed {
			if r.state != stateRunning {
				continue // aborted by a crash during the step
			}
			if prefill {
				r.firstAt = now
				ttft := now.Sub(r.arrived)
				e.stats.firstToken(ttft)
				e.metrics.ttft.Observe(ttft.Seconds())
				e.metrics.vllm.firstToken(r, ttft)
			}
			r.generated++
			r.lastAt = now
			if r.generated >= r.maxOut {
				e.finishLocked(r, now)
				finished = true
			}
			r.poke()
		}
		if !finished {
			e.mu.Unlock()
			continue
		}
		run := e.running[:0]
		for _, r := range e.running {
			if r.state == stateRunning {
				run = append(run, r)
			}
		}
		clear(e.running[len(run):])
		e.running = run
		e.mu.Unlock()
	}
}
