package aggregator

import (
	"math"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// decayedSums are exponentially decayed sums of one engine's outcomes over all
// routers, with one half-life.
type decayedSums struct {
	sent, failed, timeouts float64
	ttftSum, ttftN         float64
}

func (d *decayedSums) decay(f float64) {
	d.sent *= f
	d.failed *= f
	d.timeouts *= f
	d.ttftSum *= f
	d.ttftN *= f
}

// minEvidence is the least number of attempts (decayed) a rate is taken
// over: while fewer are in a window, failures count as a share of
// minEvidence, so that rates fall to zero as the window empties (an idle
// engine's last failures are not its error rate for ever) instead of
// keeping the ratio of whatever remains. One attempt: a window that holds a
// whole attempt reads as the plain ratio.
const minEvidence = 1

// rates returns the rates of d as the Fast or Slow part of the outcome windows.
func (d *decayedSums) rates(halfLife float64) (sentRPS, errRate, toRate, ttft float64) {
	if halfLife > 0 {
		sentRPS = d.sent * math.Ln2 / halfLife
	}
	if n := math.Max(d.sent, minEvidence); d.failed+d.timeouts > 0 {
		errRate = math.Min(1, d.failed/n)
		toRate = math.Min(1, d.timeouts/n)
	}
	if d.ttftN > 1e-9 {
		ttft = d.ttftSum / d.ttftN
	}
	return
}

// outcomeAcc folds the per-engine outcomes of router reports into an
// engine's messages.EngineOutcomes (see there for the meaning of each field).
type outcomeAcc struct {
	fast, slow decayedSums
	at         time.Time // when the sums were last decayed
	folded     time.Time // when a report was last folded in
}

// failures counts the failed attempts of o that count against the engine:
// every error class except "429" (the engine shedding its own load) and
// messages.ErrorClassClient (answers that blame the request).
func failures(o messages.EngineOutcome) int64 {
	var n int64
	for class, c := range o.Errors {
		if class != "429" && class != messages.ErrorClassClient {
			n += c
		}
	}
	return n
}

// fold adds one report's outcome for the engine, received at now and
// covering the interval ending at reportMs, and updates out.
func (a *outcomeAcc) fold(out *messages.EngineOutcomes, o messages.EngineOutcome, reportMs int64, now time.Time, s messages.Smoother) {
	if !a.folded.IsZero() && now.Sub(a.folded).Seconds() > 3*s.Fast {
		// Silent for a while (for example drained or penalised): start
		// the fast sums over, so that old failures do not count against
		// the first requests after the pause.
		a.fast = decayedSums{}
	}
	a.advance(now, s)
	a.folded = now
	failed := failures(o)
	for _, d := range []*decayedSums{&a.fast, &a.slow} {
		d.sent += float64(o.Sent)
		d.failed += float64(failed)
		d.timeouts += float64(o.Timeouts)
		if o.Succeeded > 0 && o.TTFTMs > 0 {
			d.ttftSum += o.TTFTMs * float64(o.Succeeded)
			d.ttftN += float64(o.Succeeded)
		}
	}
	switch {
	case o.Sent > 0 && o.Succeeded == 0 && failed+o.Timeouts > 0:
		out.FailedIntervals++
	case o.Succeeded > 0:
		out.FailedIntervals = 0
	}
	out.Reports++
	out.LastReport = max(out.LastReport, reportMs)
	if o.Sent > 0 {
		out.LastSent = max(out.LastSent, reportMs)
	}
	a.render(out, s)
}

// advance decays the sums to now.
func (a *outcomeAcc) advance(now time.Time, s messages.Smoother) {
	if !a.at.IsZero() {
		if dt := now.Sub(a.at).Seconds(); dt > 0 {
			a.fast.decay(messages.Retained(dt, s.Fast))
			a.slow.decay(messages.Retained(dt, s.Slow))
		} else {
			return // the clock went back: keep the later time
		}
	}
	a.at = now
}

// minRate is the rate below which a decaying window reads as zero, so
// that an idle engine's windows settle (and its state stops being
// rewritten) instead of approaching zero for ever.
const minRate = 1e-4

// tick decays the sums to now without a report and renders them into out:
// the windows are in wall time, so they empty while no report names the
// engine. It reports whether a rendered rate moved by more than minRate,
// so that a state nothing else changed is rewritten only while its rates
// fall.
func (a *outcomeAcc) tick(out *messages.EngineOutcomes, now time.Time, s messages.Smoother) bool {
	before := *out
	a.advance(now, s)
	a.render(out, s)
	moved := func(x, y messages.Window) bool {
		return math.Abs(x.Fast-y.Fast) > minRate || math.Abs(x.Slow-y.Slow) > minRate
	}
	return moved(before.ErrorRate, out.ErrorRate) || moved(before.TimeoutRate, out.TimeoutRate) ||
		moved(before.SentRPS, out.SentRPS)
}

// render writes the sums' rates into out.
func (a *outcomeAcc) render(out *messages.EngineOutcomes, s messages.Smoother) {
	fs, fe, ft, fl := a.fast.rates(s.Fast)
	ss, se, st, sl := a.slow.rates(s.Slow)
	// Each report's rates are bounded (messages.MaxRouterRate), their sum
	// over many routers is not: bounded here so the state always encodes.
	out.SentRPS = messages.Window{Fast: settle(math.Min(fs, messages.MaxRate)), Slow: settle(math.Min(ss, messages.MaxRate))}
	out.ErrorRate = messages.Window{Fast: settle(fe), Slow: settle(se)}
	out.TimeoutRate = messages.Window{Fast: settle(ft), Slow: settle(st)}
	// Keep the last TTFT seen while no attempt succeeds.
	if fl > 0 {
		out.TTFTMs.Fast = fl
	}
	if sl > 0 {
		out.TTFTMs.Slow = sl
	}
}

// settle reads a rate below minRate as zero.
func settle(v float64) float64 {
	if v < minRate {
		return 0
	}
	return v
}

// restore rebuilds decayed sums from stored windows, so that a restarted
// aggregator continues them.
func (a *outcomeAcc) restore(out *messages.EngineOutcomes, s messages.Smoother, now time.Time) {
	set := func(d *decayedSums, h, sentRPS, errRate, toRate, ttft float64) {
		d.sent = sentRPS * h / math.Ln2
		n := math.Max(d.sent, minEvidence)
		d.failed = errRate * n
		d.timeouts = toRate * n
		if ttft > 0 {
			d.ttftN = math.Max(d.sent*(1-errRate-toRate), 1e-6)
			d.ttftSum = ttft * d.ttftN
		}
	}
	set(&a.fast, s.Fast, out.SentRPS.Fast, out.ErrorRate.Fast, out.TimeoutRate.Fast, out.TTFTMs.Fast)
	set(&a.slow, s.Slow, out.SentRPS.Slow, out.ErrorRate.Slow, out.TimeoutRate.Slow, out.TTFTMs.Slow)
	a.at, a.folded = now, now
}
