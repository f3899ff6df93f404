package enginesim

import (
	"context"
	"errors"
	"time"

	"github.com/switchyard-dev/switchyard/batching"
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
	e.batch.Enqueue(r)
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
	e.batch.Clear(func(r *request, _ bool) {
		r.state = stateAborted
		r.poke()
	})
	e.kvReserved = 0
}

// reapLocked drops cancelled requests from the queue and the batch.
func (e *Engine) reapLocked() {
	e.batch.Drop(func(r *request, running bool) bool {
		if !r.cancelled {
			return false
		}
		r.state = stateAborted
		if running {
			e.kvReserved -= r.prompt + r.maxOut
		}
		return true
	})
}

// admitLocked is the batch's admission check: r is admitted while the KV
// cache can hold its prompt and its whole output.
func (e *Engine) admitLocked(r *request, _ bool) (batching.Admission, bool) {
	need := r.prompt + r.maxOut
	if e.kvReserved+need > e.opts.KVTokens {
		return batching.Admission{}, false
	}
	e.kvReserved += need
	r.state = stateRunning
	e.admitted = append(e.admitted, r)
	// vLLM computes at least the last prompt token even on a full prefix hit.
	return batching.Admission{Prefill: max(1, r.prompt-r.cached), Prompt: r.prompt, Output: r.maxOut}, true
}

// finishLocked retires r after its last token.
func (e *Engine) finishLocked(r *request, now time.Time) {
	r.state = stateDone
	r.generated, r.lastAt = r.maxOut, now
	e.kvReserved -= r.prompt + r.maxOut
	e.stats.completed(r, now)
	e.metrics.vllm.finished(r, now)
	if r.generated > 1 {
		e.metrics.tbt.Observe(r.lastAt.Sub(r.firstAt).Seconds() / float64(r.generated-1))
	}
	r.poke()
}

// firstTokenLocked records r's first token, from its prefill, at now.
func (e *Engine) firstTokenLocked(r *request, now time.Time) {
	r.firstAt, r.lastAt, r.generated = now, now, 1
	ttft := now.Sub(r.arrived)
	e.stats.firstToken(ttft)
	e.metrics.ttft.Observe(ttft.Seconds())
	e.metrics.vllm.firstToken(r, ttft)
	r.poke()
}

// maxLag is how late a step may start and still be scheduled from the ideal
// end of the previous one (which keeps timer lateness from adding up).
const maxLag = 2 * time.Millisecond

// schedule is the engine's one scheduler goroutine: it runs the batch's
// steps (package batching) on a timer until quit closes.
func (e *Engine) schedule() {
	defer e.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var lastEnd time.Time
	var now time.Time
	first := func(r *request) { e.firstTokenLocked(r, now) }
	done := func(r *request) { e.finishLocked(r, now) }
	token := func(r *request, generated int) {
		r.generated, r.lastAt = generated, now
		r.poke()
	}
	for {
		e.mu.Lock()
		e.reapLocked()
		e.admitted = e.admitted[:0]
		step := e.batch.Start(e.admitLocked)
		ms := step.Ms * e.opts.TimeScale / e.failure.factor()
		e.mu.Unlock()

		if step.Phase == batching.Idle {
			lastEnd = time.Time{} // after idling, the next step starts when it is scheduled
			select {
			case <-e.wake:
				continue
			case <-e.quit:
				return
			}
		}
		now = time.Now()
		start := lastEnd
		if lastEnd.IsZero() || now.Sub(lastEnd) > maxLag {
			start = now
		}
		for _, r := range e.admitted {
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
		// A crash during the step cleared the batch: End does nothing.
		decode := e.batch.Phase() == batching.Decode
		e.batch.End(first, done)
		if decode {
			e.batch.Decoding(token)
		}
		e.mu.Unlock()
	}
}
