// Command slotmodel computes what admission at the batch-slot level can
// reach on a fleet of continuous-batching engines past its capacity, with
// perfect knowledge of every engine's state: the served share of capacity
// and the time to first token of admitted requests, against the unloaded
// time to first token. It answers, for a given engine, whether the overload
// criteria of the reliability scenario (served >= 95% of capacity and
// admitted TTFT p99 <= 2x the unloaded p99) can be met together at all, by
// any router.
//
// The engines run the engine simulator's step model (package batching,
// without a KV limit): a FIFO queue; at a step boundary, waiting requests
// are admitted while a batch slot is free and prefilled together in one step
// of PromptTokens·PrefillMsPerToken per admitted request, which gives each
// its first token; otherwise a decode step of BaseTBT + Growth·(running−1)
// ms gives every running request one token; a request ends after
// OutputTokens tokens and frees its slot at that boundary. Arrivals are
// Poisson. The admission oracle sees
// each engine's running and queued requests exactly (no signal lag, no
// other routers) and sends an arrival to the engine with the fewest of
// them among those under their slots plus an allowance of queued requests;
// when none is, the request is shed at once. A total cap on queued requests
// across engines is a second knob.
//
//	go run ./bench/slotmodel                     # the reliability scenario's engines
//	go run ./bench/slotmodel -batch 32 -tbt 96   # more slots per output token
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/switchyard-dev/switchyard/batching"
)

// Params is one fleet and load.
type Params struct {
	Engines      int
	Batch        int           // batch slots per engine
	OutputTokens int           // tokens per request, the first from the prefill step
	PromptTokens int           // prompt tokens per request
	Cost         batching.Cost // step times (the prefill per prompt token, the decode step and its growth per request)
	Load         float64       // offered demand over capacity
	Allowance    int           // queued requests per engine beyond its slots
	QueueCap     int           // queued requests beyond slots in all (negative: no cap)
	Critical     float64       // share of arrivals that are critical: never shed, sent to the least occupied engine when every one is full
	Sheddable    float64       // share of arrivals that are sheddable (the rest beyond Critical are standard)
	KeyShed      float64       // share of all arrivals shed up front, from the sheddable ones (the router's relaxed snapshot shed by key)
	Reserve      float64       // share of an engine's limit that sheddable requests leave free (the router's SlotReserve)
	Seconds      float64       // simulated time; the first tenth is warm-up
	Seed         uint64
}

// Capacity returns one engine's sustainable rate, req/s.
func (p Params) Capacity() float64 {
	return p.Cost.Capacity(p.Batch, p.PromptTokens, p.OutputTokens)
}

// Result is what one run measured.
type Result struct {
	Served           float64 // completed req/s over the fleet's capacity
	TTFTP50, TTFTP99 float64 // admitted requests' time to first token, ms
	CriticalP99      float64 // critical requests' TTFT p99, ms (NaN without critical requests)
	Forced           float64 // share of critical requests admitted beyond every limit
}

type engine struct {
	batch *batching.Batch[float64] // arrival times, ms; negative for critical requests
	next  float64                  // end of the current step; +Inf while idle
}

func (e *engine) occupancy() int { return e.batch.Running() + e.batch.Queued() }

// Run simulates p.
func Run(p Params) Result {
	rng := rand.New(rand.NewPCG(p.Seed, 0x5107))
	capacity := p.Capacity() * float64(p.Engines)
	lambda := p.Load * capacity / 1000 // per ms
	engines := make([]*engine, p.Engines)
	for i := range engines {
		engines[i] = &engine{batch: batching.New[float64](p.Cost, p.Batch), next: math.Inf(1)}
	}
	end := p.Seconds * 1000
	warm := end / 10
	var ttft, crit []float64
	completed, critical, forced := 0, 0, 0
	admit := func(float64, bool) (batching.Admission, bool) {
		return batching.Admission{Prefill: p.PromptTokens, Prompt: p.PromptTokens, Output: p.OutputTokens}, true
	}
	start := func(e *engine, now float64) {
		e.next = math.Inf(1)
		if st := e.batch.Start(admit); st.Phase != batching.Idle {
			e.next = now + st.Ms
		}
	}
	var now float64
	first := func(a float64) {
		if math.Abs(a) > warm {
			ttft = append(ttft, now-math.Abs(a))
			if a < 0 {
				crit = append(crit, now+a)
			}
		}
	}
	done := func(float64) {
		if now > warm {
			completed++
		}
	}
	arrival := rng.ExpFloat64() / lambda
	for {
		next := engines[0]
		for _, e := range engines[1:] {
			if e.next < next.next {
				next = e
			}
		}
		if arrival < next.next {
			now = arrival
			if now > end {
				break
			}
			arrival += rng.ExpFloat64() / lambda
			isCrit, isShed := false, false
			if p.Critical > 0 || p.Sheddable > 0 {
				u := rng.Float64()
				isCrit, isShed = u < p.Critical, u >= 1-p.Sheddable
			}
			if isShed && p.KeyShed > 0 && p.Sheddable > 0 && rng.Float64() < p.KeyShed/p.Sheddable {
				continue // shed by key
			}
			queued := 0
			for _, e := range engines {
				queued += max(0, e.occupancy()-p.Batch)
			}
			var pick, least *engine
			for _, e := range engines {
				limit := p.Batch
				if p.QueueCap < 0 || queued < p.QueueCap {
					limit += p.Allowance
				}
				if isShed && p.Reserve > 0 {
					limit -= int(math.Ceil(p.Reserve * float64(limit)))
				}
				if e.occupancy() < limit && (pick == nil || e.occupancy() < pick.occupancy()) {
					pick = e
				}
				if least == nil || e.occupancy() < least.occupancy() {
					least = e
				}
			}
			if isCrit && now > warm {
				critical++
			}
			if pick == nil && isCrit {
				pick = least
				if now > warm {
					forced++
				}
			}
			if pick == nil {
				continue // shed
			}
			at := now
			if isCrit {
				at = -now
			}
			pick.batch.Enqueue(at)
			if math.IsInf(pick.next, 1) {
				start(pick, now)
			}
			continue
		}
		e := next
		now = e.next
		e.batch.End(first, done)
		start(e, now)
	}
	pct := func(xs []float64, q float64) float64 {
		if len(xs) == 0 {
			return math.NaN()
		}
		slices.Sort(xs)
		return xs[int(q*float64(len(xs)-1))]
	}
	return Result{Served: float64(completed) / ((end - warm) / 1000) / capacity, TTFTP50: pct(ttft, 0.5), TTFTP99: pct(ttft, 0.99),
		CriticalP99: pct(crit, 0.99), Forced: float64(forced) / float64(max(critical, 1))}
}

func main() {
	p := Params{}
	flag.IntVar(&p.Engines, "engines", 4, "engines")
	flag.IntVar(&p.Batch, "batch", 20, "batch slots per engine")
	flag.IntVar(&p.OutputTokens, "output", 16, "output tokens per request")
	flag.IntVar(&p.PromptTokens, "prompt", 64, "prompt tokens per request")
	flag.Float64Var(&p.Cost.PrefillMsPerToken, "prefill", 0.02, "prefill ms per prompt token")
	flag.Float64Var(&p.Cost.TBTBaseMs, "tbt", 60, "decode step with one running request, ms")
	flag.Float64Var(&p.Cost.TBTPerRequestMs, "growth", 0.2, "decode step growth per extra running request, ms")
	flag.Float64Var(&p.Load, "load", 1.5, "offered demand over capacity")
	flag.Float64Var(&p.Seconds, "seconds", 600, "simulated seconds per run")
	flag.Uint64Var(&p.Seed, "seed", 1, "seed")
	unloaded := flag.Float64("unloaded", 0.25, "load of the unloaded baseline")
	maxAllow := flag.Int("max-allow", 3, "largest allowance of queued requests per engine to tabulate")
	flag.Float64Var(&p.Critical, "critical", 0, "share of critical requests, never shed; with it, a second table")
	flag.Float64Var(&p.Sheddable, "sheddable", 0, "share of sheddable requests (second table)")
	flag.Float64Var(&p.KeyShed, "key-shed", 0, "share of all requests shed up front from the sheddable ones, as the router's relaxed snapshot shed does (second table)")
	flag.Float64Var(&p.Reserve, "reserve", 0, "share of an engine's limit sheddable requests leave free, as the router's SlotReserve (second table)")
	flag.Parse()
	if p.Engines < 1 || p.Batch < 1 || p.OutputTokens < 1 || p.PromptTokens < 0 || !(p.Cost.TBTBaseMs > 0) || !(p.Load > 0) || !(p.Seconds > 0) {
		fmt.Fprintln(os.Stderr, "slotmodel: engines, batch, output, tbt, load and seconds must be positive")
		os.Exit(2)
	}
	base := p
	base.Load, base.Allowance, base.QueueCap, base.Critical, base.Sheddable, base.KeyShed = *unloaded, p.Batch*10, -1, 0, 0, 0
	u := Run(base)
	fmt.Printf("%d engines x %d slots, %d output tokens, decode step %.0f ms (+%.1f per request), prefill %.1f ms: capacity %.1f req/s, %.2f completions per decode step per engine\n",
		p.Engines, p.Batch, p.OutputTokens, p.Cost.TBTBaseMs, p.Cost.TBTPerRequestMs, p.Cost.PrefillMs(p.PromptTokens), p.Capacity()*float64(p.Engines),
		float64(p.Batch)/float64(p.OutputTokens-1))
	fmt.Printf("unloaded (%.0f%% of capacity): TTFT p50 %.1f ms, p99 %.1f ms\n", 100**unloaded, u.TTFTP50, u.TTFTP99)
	fmt.Printf("offered %.0f%% of capacity, admission by an oracle that sees every engine exactly:\n", 100*p.Load)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "queued per engine\tqueued in all\tserved\tTTFT p50 ms\tp99 ms\tp99 / unloaded p99\t")
	for allow := 0; allow <= *maxAllow; allow++ {
		// Caps at or below (allow−1)·engines repeat the rows of a smaller
		// allowance; caps at or above allow·engines bind nothing.
		var caps []int
		for _, c := range []int{1, 2, p.Engines} {
			if c > (allow-1)*p.Engines && c < allow*p.Engines {
				caps = append(caps, c)
			}
		}
		caps = append(caps, -1)
		for _, c := range caps {
			q := p
			q.Allowance, q.QueueCap, q.Critical, q.Sheddable, q.KeyShed, q.Reserve = allow, c, 0, 0, 0, 0
			r := Run(q)
			all := "any"
			if c >= 0 {
				all = fmt.Sprint(c)
			}
			fmt.Fprintf(w, "%d\t%s\t%.1f%%\t%.1f\t%.1f\t%.2fx\t\n", allow, all, 100*r.Served, r.TTFTP50, r.TTFTP99, r.TTFTP99/u.TTFTP99)
		}
	}
	w.Flush()
	if p.Critical > 0 {
		fmt.Printf("with %.0f%% critical requests, never shed (sent to the least occupied engine when every one is full):\n", 100*p.Critical)
		w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "queued per engine\tserved\tTTFT p99 ms\tp99 / unloaded p99\tcritical p99 ms\tcritical beyond the limits\t")
		for allow := 0; allow <= *maxAllow; allow++ {
			q := p
			q.Allowance, q.QueueCap = allow, -1
			r := Run(q)
			fmt.Fprintf(w, "%d\t%.1f%%\t%.1f\t%.2fx\t%.1f\t%.1f%%\t\n", allow, 100*r.Served, r.TTFTP99, r.TTFTP99/u.TTFTP99, r.CriticalP99, 100*r.Forced)
		}
		w.Flush()
	}
}
