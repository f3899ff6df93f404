package batching

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// req is a test request: its lengths and what the batch told about it.
type req struct {
	id             int
	prompt, output int
	cached         int // prompt tokens served from the cache
	firstAt        int // step index of its first token, -1 before
	doneAt         int // step index of its last token, -1 before
}

func newReq(id, prompt, output int) *req {
	return &req{id: id, prompt: prompt, output: output, firstAt: -1, doneAt: -1}
}

// admitAll admits every request the batch has room for.
func admitAll(r *req, _ bool) (Admission, bool) {
	return Admission{Prefill: r.prompt - r.cached, Prompt: r.prompt, Output: r.output}, true
}

// run drives b through steps steps, enqueueing arrivals[k] before step k,
// and returns the steps.
func run(b *Batch[*req], arrivals map[int][]*req, steps int) []Step {
	var out []Step
	for k := range steps {
		for _, r := range arrivals[k] {
			b.Enqueue(r)
		}
		st := b.Start(admitAll)
		out = append(out, st)
		b.End(func(r *req) { r.firstAt = k }, func(r *req) { r.doneAt = k })
	}
	return out
}

var testCost = Cost{PrefillMsPerToken: 0.5, TBTBaseMs: 10, TBTPerRequestMs: 1, TBTPerKTokenMs: 2}

func TestCost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		c       Cost
		running int
		context int64
		prefill int
		decode  float64
		prefMs  float64
	}{
		{"one request", testCost, 1, 0, 100, 10, 50},
		{"an empty batch costs what one request does", testCost, 0, 0, 0, 10, 0},
		{"each running request adds its share", testCost, 8, 0, 1, 17, 0.5},
		{"context adds per thousand tokens", testCost, 8, 4000, 10, 25, 5},
		{"no growth", Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 15}, 32, 1 << 20, 256, 15, 5.12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.DecodeMs(tc.running, tc.context); math.Abs(got-tc.decode) > 1e-12 {
				t.Errorf("DecodeMs(%d, %d) = %g, want %g", tc.running, tc.context, got, tc.decode)
			}
			if got := tc.c.PrefillMs(tc.prefill); math.Abs(got-tc.prefMs) > 1e-12 {
				t.Errorf("PrefillMs(%d) = %g, want %g", tc.prefill, got, tc.prefMs)
			}
		})
	}
	// The decode step grows with the batch; the time per token shrinks.
	prev, prevPer := 0.0, math.Inf(1)
	for b := 1; b <= 256; b *= 2 {
		ms := testCost.DecodeMs(b, 0)
		if ms <= prev || ms/float64(b) >= prevPer {
			t.Errorf("batch %d: decode step %g ms (%g per request) after %g (%g)", b, ms, ms/float64(b), prev, prevPer)
		}
		prev, prevPer = ms, ms/float64(b)
	}
}

// A request's first token comes from its prefill step, and each decode
// step adds one; a request of n tokens leaves after n−1 decode steps, one
// of 1 token with its prefill.
func TestBatchPrefillDecodeSplit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		output int
		// wantDone is the step index of the last token when the request
		// arrives before step 0 on an empty engine.
		wantDone int
	}{
		{"one token", 1, 0},
		{"two tokens", 2, 1},
		{"sixteen tokens", 16, 15},
		{"zero counts as one", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New[*req](testCost, 4)
			r := newReq(1, 100, tc.output)
			steps := run(b, map[int][]*req{0: {r}}, tc.wantDone+3)
			if steps[0].Phase != Prefill || steps[0].Ms != testCost.PrefillMs(100) {
				t.Fatalf("step 0 is %+v, want a prefill of 100 tokens (%g ms)", steps[0], testCost.PrefillMs(100))
			}
			if r.firstAt != 0 || r.doneAt != tc.wantDone {
				t.Errorf("first token at step %d, last at %d; want 0 and %d", r.firstAt, r.doneAt, tc.wantDone)
			}
			for k := 1; k <= tc.wantDone; k++ {
				// The context is the prompt plus the tokens generated before the step.
				want := Step{Phase: Decode, Ms: testCost.DecodeMs(1, int64(100+k))}
				if steps[k] != want {
					t.Errorf("step %d is %+v, want %+v", k, steps[k], want)
				}
			}
			if st := steps[tc.wantDone+1]; st.Phase != Idle || b.Running() != 0 || b.Context() != 0 {
				t.Errorf("after the last token: step %+v, running %d, context %d; want idle and empty", st, b.Running(), b.Context())
			}
		})
	}
}

// A prefill step pauses decoding: the requests already running get no token
// from it, and finish one step later than they would have.
func TestBatchPrefillPausesDecode(t *testing.T) {
	b := New[*req](testCost, 4)
	old, late := newReq(1, 10, 4), newReq(2, 30, 2)
	steps := run(b, map[int][]*req{0: {old}, 2: {late}}, 6)
	want := []Phase{Prefill, Decode, Prefill, Decode, Decode, Idle}
	for k, st := range steps {
		if st.Phase != want[k] {
			t.Errorf("step %d: %s, want %s", k, st.Phase, want[k])
		}
	}
	if steps[2].Ms != testCost.PrefillMs(30) {
		t.Errorf("the second prefill lasts %g ms, want %g (the new prompt only)", steps[2].Ms, testCost.PrefillMs(30))
	}
	// old: first at 0, tokens at 1, 3, 4 (step 2 is the other's prefill).
	if old.doneAt != 4 || late.firstAt != 2 || late.doneAt != 3 {
		t.Errorf("old done at %d (want 4); late first at %d (want 2), done at %d (want 3)", old.doneAt, late.firstAt, late.doneAt)
	}
	if steps[3].Ms != testCost.DecodeMs(2, 10+2+30+1) {
		t.Errorf("decode of both lasts %g ms, want %g", steps[3].Ms, testCost.DecodeMs(2, 43))
	}
}

// Admission happens at step boundaries only, in arrival order, while a slot
// is free and the caller accepts the head of the queue.
func TestBatchAdmission(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBatch int
		queued   int
		// budget is how many requests the caller's cache accepts in all.
		budget       int
		wantAdmitted int
	}{
		{"room for all", 8, 5, 100, 5},
		{"slots bind", 3, 5, 100, 3},
		{"cache binds", 8, 5, 2, 2},
		{"nothing fits", 8, 5, 0, 0},
		{"max batch below one is one", 0, 3, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New[*req](testCost, tc.maxBatch)
			for i := range tc.queued {
				b.Enqueue(newReq(i, 10, 3))
			}
			var order []int
			var alone []bool
			st := b.Start(func(r *req, a bool) (Admission, bool) {
				if len(order) >= tc.budget {
					return Admission{}, false
				}
				order, alone = append(order, r.id), append(alone, a)
				return Admission{Prefill: r.prompt, Prompt: r.prompt, Output: r.output}, true
			})
			if len(order) != tc.wantAdmitted || b.Running() != tc.wantAdmitted || b.Queued() != tc.queued-tc.wantAdmitted {
				t.Fatalf("admitted %v, running %d, queued %d; want %d admitted", order, b.Running(), b.Queued(), tc.wantAdmitted)
			}
			if !slices.IsSorted(order) {
				t.Errorf("admitted out of arrival order: %v", order)
			}
			for i, a := range alone {
				if a != (i == 0) {
					t.Errorf("admission %d told alone=%v", i, a)
				}
			}
			if tc.wantAdmitted == 0 {
				if st.Phase != Idle {
					t.Errorf("nothing admitted but the step is %s", st.Phase)
				}
				return
			}
			if st.Phase != Prefill || st.Ms != testCost.PrefillMs(10*tc.wantAdmitted) {
				t.Errorf("step %+v, want a prefill of %d tokens", st, 10*tc.wantAdmitted)
			}
			// A request arriving during the step waits for the next boundary.
			b.Enqueue(newReq(99, 10, 3))
			if b.Running() != tc.wantAdmitted {
				t.Errorf("running %d during the step, want %d", b.Running(), tc.wantAdmitted)
			}
			b.End(func(*req) {}, func(*req) {})
		})
	}
}

// A slot freed by a last token is taken at the next boundary, by a prefill
// that again pauses the others.
func TestBatchFreedSlotRefilled(t *testing.T) {
	b := New[*req](testCost, 2)
	a, c, d := newReq(1, 10, 2), newReq(2, 10, 5), newReq(3, 10, 2)
	steps := run(b, map[int][]*req{0: {a, c, d}}, 8)
	// 0 prefill a,c; 1 decode (a done); 2 prefill d; 3 decode (d done); 4, 5 decode (c done at 5).
	want := []Phase{Prefill, Decode, Prefill, Decode, Decode, Decode, Idle, Idle}
	for k, st := range steps {
		if st.Phase != want[k] {
			t.Errorf("step %d: %s, want %s", k, st.Phase, want[k])
		}
	}
	if a.doneAt != 1 || d.firstAt != 2 || d.doneAt != 3 || c.doneAt != 5 {
		t.Errorf("a done %d (1), d first %d (2) done %d (3), c done %d (5)", a.doneAt, d.firstAt, d.doneAt, c.doneAt)
	}
}

// A cached prefix shortens the prefill but the prompt still holds context.
func TestBatchCachedPrefix(t *testing.T) {
	b := New[*req](testCost, 2)
	r := newReq(1, 1000, 3)
	r.cached = 900
	steps := run(b, map[int][]*req{0: {r}}, 2)
	if steps[0].Ms != testCost.PrefillMs(100) || steps[1].Ms != testCost.DecodeMs(1, 1001) {
		t.Errorf("steps %+v, want a prefill of 100 tokens then a decode over 1001 tokens of context", steps)
	}
}

func TestBatchDecodingAndDrop(t *testing.T) {
	b := New[*req](testCost, 4)
	x, y, z := newReq(1, 10, 10), newReq(2, 20, 10), newReq(3, 30, 10)
	run(b, map[int][]*req{0: {x, y}}, 3) // prefill, two decodes
	b.Enqueue(z)
	got := map[int]int{}
	b.Decoding(func(r *req, n int) { got[r.id] = n })
	if got[1] != 3 || got[2] != 3 || len(got) != 2 {
		t.Fatalf("Decoding saw %v, want requests 1 and 2 at 3 tokens", got)
	}
	var dropped []int
	b.Drop(func(r *req, running bool) bool {
		if r.id == 2 || r.id == 3 {
			if running != (r.id == 2) {
				t.Errorf("request %d told running=%v", r.id, running)
			}
			dropped = append(dropped, r.id)
			return true
		}
		return false
	})
	if len(dropped) != 2 || b.Running() != 1 || b.Queued() != 0 || b.Context() != 10+3 {
		t.Errorf("dropped %v; running %d, queued %d, context %d; want 1 running with 13 tokens", dropped, b.Running(), b.Queued(), b.Context())
	}
	if st := b.Start(admitAll); st.Phase != Decode || st.Ms != testCost.DecodeMs(1, 13) {
		t.Errorf("next step %+v, want a decode of the one left", st)
	}
}

func TestBatchClear(t *testing.T) {
	b := New[*req](testCost, 2)
	rs := []*req{newReq(1, 10, 10), newReq(2, 10, 10), newReq(3, 10, 10), newReq(4, 10, 10)}
	run(b, map[int][]*req{0: rs[:1]}, 2) // 1 decoding
	b.Enqueue(rs[1])
	b.Enqueue(rs[2])
	b.Enqueue(rs[3])
	b.Start(admitAll) // prefill of 2; 3 and 4 queued
	type lost struct {
		id      int
		started bool
	}
	var got []lost
	b.Clear(func(r *req, started bool) { got = append(got, lost{r.id, started}) })
	want := []lost{{1, true}, {2, false}, {3, false}, {4, false}}
	if !slices.Equal(got, want) {
		t.Errorf("Clear reported %v, want %v", got, want)
	}
	if b.Running() != 0 || b.Queued() != 0 || b.Context() != 0 || b.Phase() != Idle {
		t.Errorf("after Clear: running %d queued %d context %d phase %s", b.Running(), b.Queued(), b.Context(), b.Phase())
	}
	b.End(func(*req) { t.Error("first token after Clear") }, func(*req) { t.Error("done after Clear") })
	if st := b.Start(admitAll); st.Phase != Idle {
		t.Errorf("step after Clear: %+v", st)
	}
}

// Capacity is the throughput the step model reaches with a queue that never
// empties, for uniform requests.
func TestCapacityMatchesSaturation(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		c                     Cost
		batch, prompt, output int
	}{
		{"enginesim defaults", Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 15, TBTPerRequestMs: 0.1}, 32, 256, 128},
		{"slot model", Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 60, TBTPerRequestMs: 0.2}, 20, 64, 16},
		{"context term", Cost{PrefillMsPerToken: 0.01, TBTBaseMs: 12, TBTPerRequestMs: 0.065, TBTPerKTokenMs: 0.04}, 64, 2000, 200},
		{"one-token requests", Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 15}, 8, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New[*req](tc.c, tc.batch)
			// Measure after the first 50 batches, once admissions have spread out.
			now, done, start, measured := 0.0, 0, 0.0, 0
			for done < 250*tc.batch {
				for b.Queued() < tc.batch {
					b.Enqueue(newReq(0, tc.prompt, tc.output))
				}
				now += b.Start(admitAll).Ms
				b.End(func(*req) {}, func(*req) { done++ })
				if done <= 50*tc.batch {
					start, measured = now, done
				}
			}
			got := float64(done-measured) / ((now - start) / 1000)
			want := tc.c.Capacity(tc.batch, tc.prompt, tc.output)
			t.Logf("saturated %.3f req/s, Capacity %.3f", got, want)
			if !(math.Abs(got/want-1) <= 0.02) {
				t.Errorf("saturated throughput %.2f req/s, Capacity says %.2f", got, want)
			}
		})
	}
}

// IdleMs is the latency the step model gives a lone request.
func TestIdleMs(t *testing.T) {
	for _, tc := range []struct {
		name           string
		c              Cost
		prompt, output int
	}{
		{"no context term", Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 15, TBTPerRequestMs: 0.1}, 256, 128},
		{"context term", testCost, 500, 40},
		{"one token", testCost, 500, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New[*req](tc.c, 4)
			got := 0.0
			r := newReq(1, tc.prompt, tc.output)
			b.Enqueue(r)
			for r.doneAt < 0 {
				got += b.Start(admitAll).Ms
				b.End(func(*req) {}, func(r *req) { r.doneAt = 0 })
			}
			if want := tc.c.IdleMs(tc.prompt, tc.output); math.Abs(got-want) > 1e-9*want {
				t.Errorf("a lone request takes %g ms in the model, IdleMs says %g", got, want)
			}
		})
	}
}

// Random arrivals, lengths, cache refusals and client cancellations keep
// the batch's invariants: at most MaxBatch run, every admitted request gets
// its first token once and its last once, after exactly output−1 decode
// steps of its own, and an emptied batch holds no context.
func TestBatchInvariantsRandom(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		rng := rand.New(rand.NewPCG(seed, 99))
		const maxBatch = 6
		b := New[*req](testCost, maxBatch)
		tokens := map[*req]int{} // tokens seen per running request
		firsts, dones, dropped, next := 0, 0, 0, 0
		var all []*req
		for step := range 3000 {
			for range rng.IntN(3) {
				r := newReq(next, 1+rng.IntN(500), rng.IntN(20))
				next++
				all = append(all, r)
				b.Enqueue(r)
			}
			if rng.IntN(50) == 0 {
				b.Drop(func(r *req, running bool) bool {
					if rng.IntN(4) != 0 {
						return false
					}
					if _, ok := tokens[r]; ok != running {
						t.Fatalf("seed %d: request %d dropped as running=%v, tokens seen %v", seed, r.id, running, ok)
					}
					delete(tokens, r)
					r.doneAt = -2
					dropped++
					return true
				})
			}
			st := b.Start(func(r *req, _ bool) (Admission, bool) {
				if rng.IntN(10) == 0 {
					return Admission{}, false // the cache is full this time
				}
				return Admission{Prefill: r.prompt, Prompt: r.prompt, Output: r.output}, true
			})
			if b.Running() > maxBatch {
				t.Fatalf("seed %d step %d: %d running", seed, step, b.Running())
			}
			b.End(func(r *req) {
				if r.firstAt >= 0 {
					t.Fatalf("seed %d: request %d got a second first token", seed, r.id)
				}
				r.firstAt = step
				tokens[r] = 1
				firsts++
			}, func(r *req) {
				if r.doneAt != -1 || tokens[r] != max(r.output, 1)-boolInt(st.Phase == Decode) {
					t.Fatalf("seed %d: request %d of %d tokens done after %d (done at %d)", seed, r.id, r.output, tokens[r], r.doneAt)
				}
				delete(tokens, r)
				r.doneAt = step
				dones++
			})
			if st.Phase == Decode {
				for r := range tokens {
					tokens[r]++
				}
				b.Decoding(func(r *req, n int) {
					if tokens[r] != n {
						t.Fatalf("seed %d: request %d has %d tokens, Decoding says %d", seed, r.id, tokens[r], n)
					}
				})
			}
		}
		// Drain: no more arrivals, no refusals.
		for b.Running()+b.Queued() > 0 {
			b.Start(admitAll)
			b.End(func(r *req) { r.firstAt = 0; firsts++ }, func(*req) { dones++ })
		}
		if b.Context() != 0 || dones+dropped != len(all) {
			t.Errorf("seed %d: drained with context %d; %d done + %d dropped of %d", seed, b.Context(), dones, dropped, len(all))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPrefillWeight checks that a prompt token's weight is its prefill
// time over a full decode step's time per running request, and that the
// requests' work in those units is proportional to the time they cost a
// full batch, which is what the capacity counts.
func TestPrefillWeight(t *testing.T) {
	c := Cost{PrefillMsPerToken: 0.008, TBTBaseMs: 12, TBTPerRequestMs: 0.1, TBTPerKTokenMs: 0.04}
	const batch, prompt, output = 64, 2000, 30
	tbt := c.DecodeMs(batch, 0) + c.TBTPerKTokenMs*batch*(prompt+output/2.0)/1000
	rho := c.PrefillWeight(batch, prompt, output)
	if want := 0.008 * batch / tbt; math.Abs(rho-want) > 1e-12 {
		t.Fatalf("PrefillWeight = %v, want %v", rho, want)
	}
	// One request's share of a full batch's time, in units of one decode
	// token's share: its work, and 1000/capacity ms per request.
	perReqMs := 1000 / c.Capacity(batch, prompt, output)
	work := rho*prompt + (output - 1)
	if got := perReqMs / (tbt / batch); math.Abs(got-work) > 1e-9*work {
		t.Fatalf("a request costs %v decode-token shares, its work is %v", got, work)
	}
}
