package workload

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// ErrGenerator is wrapped by every error of a generator's options.
var ErrGenerator = errors.New("workload: bad generator")

// Families lists the generator families GeneratorDefaults knows, each a
// preset of SessionOptions for one kind of traffic.
func Families() []string { return []string{"chat", "tenants", "agentic", "code"} }

// SessionOptions describes a workload of sessions: conversations, agent
// loops or editing sessions. Each session belongs to a tenant whose system
// prompt leads every prompt of the session; the session then appends its
// own first content, and every later request resends everything so far
// (prompt and output of the previous request) plus the new turn's tokens,
// as chat APIs do. Prompt blocks are named by content: a block of 512
// tokens that lies wholly inside a tenant's system prompt has the same id in
// every session of that tenant, one wholly inside a session's earlier
// content the same id in every later request of the session, and a block
// that ends past either (the partial last block of a prompt, the block
// where the system prompt meets the session's text) an id of its own.
type SessionOptions struct {
	// Rate is the mean request rate, req/s (sessions start at Rate / the
	// mean number of turns).
	Rate float64
	// Duration bounds the arrivals.
	Duration time.Duration
	// Tenants is the number of tenants, each with its own system prompt; ≥ 1.
	Tenants int
	// TenantSkew is the Zipf exponent of tenant popularity: tenant k is
	// chosen with weight 1/(k+1)^TenantSkew (0: uniform).
	TenantSkew float64
	// SystemTokens is the length of every tenant's system prompt.
	SystemTokens int
	// FirstTokens is the mean length of a session's first content (the
	// first user message, the task, the file being edited).
	FirstTokens int
	// TurnTokens is the mean number of tokens a later turn adds (a user
	// message, a tool result, an edit).
	TurnTokens int
	// OutputTokens is the mean output length.
	OutputTokens int
	// Turns is the mean number of requests of a session (geometric, ≥ 1).
	Turns float64
	// ThinkS is the mean time between a session's requests, seconds
	// (exponential).
	ThinkS float64
	// MaxContextTokens ends a session whose next prompt would exceed it; 0
	// means no limit.
	MaxContextTokens int
	// Exponential draws FirstTokens, TurnTokens and OutputTokens
	// geometrically with those means instead of fixed.
	Exponential bool
	// SessionIDs gives each request its session's id; false sends them
	// without one, as most clients do, so routers see only the content.
	SessionIDs bool
	// Diurnal modulates the rate of session starts.
	Diurnal Diurnal
	// Bursts multiplies the rate of session starts during periodic bursts.
	Bursts Bursts
	// Salt distinguishes tenants of unrelated workloads: tenants of two
	// workloads with the same salt share their system prompts.
	Salt uint64
	// Seed makes the workload reproducible.
	Seed uint64
}

// Diurnal is a sinusoidal swing of the rate: rate × (1 + Amplitude ·
// sin(2π t / PeriodS)). A zero PeriodS means none.
type Diurnal struct {
	PeriodS   float64
	Amplitude float64
}

// Bursts multiplies the rate by Factor for BurstS seconds every EveryS
// seconds, the first burst starting at StartS. A zero EveryS means none.
type Bursts struct {
	EveryS, BurstS, StartS float64
	Factor                 float64
}

// GeneratorDefaults returns the preset of a family:
//
//   - chat: one tenant whose 3,072-token system prompt (six blocks) leads
//     every conversation; 200-token user turns, 250-token answers, 6 turns.
//   - tenants: 200 tenants with 1,536-token system prompts, Zipf-popular
//     (skew 1), otherwise chat.
//   - agentic: agent loops under a 2,048-token prompt of tool definitions;
//     each step appends a 1,200-token tool result, answers are 120-token
//     tool calls, 12 steps a second apart, context capped at 32k tokens.
//   - code: code completion over 50 repositories whose 1,024-token shared
//     context leads a 3,000-token file; each completion adds a 48-token
//     edit and writes 32 tokens: prefill-heavy.
func GeneratorDefaults(family string) (SessionOptions, error) {
	o := SessionOptions{Tenants: 1, Exponential: true, MaxContextTokens: 32768}
	switch family {
	case "chat":
		o.SystemTokens, o.FirstTokens, o.TurnTokens, o.OutputTokens, o.Turns, o.ThinkS = 3072, 300, 200, 250, 6, 20
	case "tenants":
		o.Tenants, o.TenantSkew = 200, 1
		o.SystemTokens, o.FirstTokens, o.TurnTokens, o.OutputTokens, o.Turns, o.ThinkS = 1536, 300, 200, 250, 6, 20
	case "agentic":
		o.SystemTokens, o.FirstTokens, o.TurnTokens, o.OutputTokens, o.Turns, o.ThinkS = 2048, 600, 1200, 120, 12, 1
	case "code":
		o.Tenants = 50
		o.SystemTokens, o.FirstTokens, o.TurnTokens, o.OutputTokens, o.Turns, o.ThinkS = 1024, 3000, 48, 32, 8, 4
	default:
		return o, fmt.Errorf("%w: family %q (want one of %s)", ErrGenerator, family, strings.Join(Families(), ", "))
	}
	o.Salt = uint64(len(family))<<56 | uint64(family[0])<<48
	return o, nil
}

// Validate checks the options, naming the first bad field.
func (o *SessionOptions) Validate() error {
	bad := func(f string, v any, want string) error {
		return fmt.Errorf("%w: %s %v: want %s", ErrGenerator, f, v, want)
	}
	fin := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !fin(o.Rate) || o.Rate <= 0:
		return bad("Rate", o.Rate, "> 0")
	case o.Duration <= 0:
		return bad("Duration", o.Duration, "> 0")
	case o.Tenants < 1 || o.Tenants > 1<<20:
		return bad("Tenants", o.Tenants, "1..1048576")
	case !fin(o.TenantSkew) || o.TenantSkew < 0 || o.TenantSkew > 4:
		return bad("TenantSkew", o.TenantSkew, "0..4")
	case o.SystemTokens < 0 || o.SystemTokens > 1_000_000:
		return bad("SystemTokens", o.SystemTokens, "0..1000000")
	case o.FirstTokens < 1 || o.FirstTokens > 1_000_000:
		return bad("FirstTokens", o.FirstTokens, "1..1000000")
	case o.TurnTokens < 0 || o.TurnTokens > 1_000_000:
		return bad("TurnTokens", o.TurnTokens, "0..1000000")
	case o.OutputTokens < 1 || o.OutputTokens > 1_000_000:
		return bad("OutputTokens", o.OutputTokens, "1..1000000")
	case !fin(o.Turns) || o.Turns < 1 || o.Turns > 10000:
		return bad("Turns", o.Turns, "1..10000")
	case !fin(o.ThinkS) || o.ThinkS < 0 || o.ThinkS > 86400:
		return bad("ThinkS", o.ThinkS, "0..86400")
	case o.MaxContextTokens < 0:
		return bad("MaxContextTokens", o.MaxContextTokens, "≥ 0")
	case !fin(o.Diurnal.PeriodS) || o.Diurnal.PeriodS < 0:
		return bad("Diurnal.PeriodS", o.Diurnal.PeriodS, "≥ 0")
	case !fin(o.Diurnal.Amplitude) || o.Diurnal.Amplitude < 0 || o.Diurnal.Amplitude > 1:
		return bad("Diurnal.Amplitude", o.Diurnal.Amplitude, "0..1")
	case !fin(o.Bursts.EveryS) || o.Bursts.EveryS < 0:
		return bad("Bursts.EveryS", o.Bursts.EveryS, "≥ 0")
	case o.Bursts.EveryS > 0 && (!fin(o.Bursts.BurstS) || o.Bursts.BurstS <= 0 || o.Bursts.BurstS > o.Bursts.EveryS):
		return bad("Bursts.BurstS", o.Bursts.BurstS, "0 < burst ≤ every")
	case o.Bursts.EveryS > 0 && (!fin(o.Bursts.Factor) || o.Bursts.Factor < 0 || o.Bursts.Factor > 1000):
		return bad("Bursts.Factor", o.Bursts.Factor, "0..1000")
	case !fin(o.Bursts.StartS) || o.Bursts.StartS < 0:
		return bad("Bursts.StartS", o.Bursts.StartS, "≥ 0")
	}
	return nil
}

// RateFactor returns the rate multiplier of the diurnal swing and the
// bursts at t seconds.
func (o *SessionOptions) RateFactor(t float64) float64 {
	f := 1.0
	if d := o.Diurnal; d.PeriodS > 0 {
		f *= 1 + d.Amplitude*math.Sin(2*math.Pi*t/d.PeriodS)
	}
	if b := o.Bursts; b.EveryS > 0 && t >= b.StartS {
		if math.Mod(t-b.StartS, b.EveryS) < b.BurstS {
			f *= b.Factor
		}
	}
	return f
}

// maxRateFactor bounds RateFactor, for thinning.
func (o *SessionOptions) maxRateFactor() float64 {
	f := 1 + o.Diurnal.Amplitude
	if o.Bursts.EveryS > 0 {
		f *= max(1, o.Bursts.Factor)
	}
	return f
}

// Sessions generates a session workload. It is pure: the same options give
// the same requests. Requests are sorted by arrival time.
func Sessions(o SessionOptions) ([]Request, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5e55_1000))
	end := o.Duration.Seconds()
	cum := make([]float64, o.Tenants)
	total := 0.0
	for k := range cum {
		total += 1 / math.Pow(float64(k+1), o.TenantSkew)
		cum[k] = total
	}
	length := func(m int) int {
		if !o.Exponential || m <= 1 {
			return m
		}
		u := 1 - rng.Float64()
		return int(max(1, math.Ceil(math.Log(u)/math.Log1p(-1/float64(m)))))
	}
	// Session starts: a Poisson process at Rate/Turns modulated by
	// RateFactor, drawn by thinning a process at its maximum.
	startRate := o.Rate / o.Turns
	peak := startRate * o.maxRateFactor()
	var out []Request
	var sid uint64
	// Sessions start before the workload does, so that it opens in its
	// steady state (sessions at every stage of their life) rather than
	// ramping up over the first sessions' lifetime; requests before 0 are
	// dropped.
	t := -3 * o.Turns * o.ThinkS
	for {
		t += rng.ExpFloat64() / peak
		if t >= end {
			break
		}
		if rng.Float64()*peak >= startRate*o.RateFactor(t) {
			continue
		}
		sid++
		session := mixID(o.Seed ^ mixID(sid))
		u := rng.Float64() * total
		tenant, _ := slices.BinarySearch(cum, u)
		tenant = min(tenant, o.Tenants-1)
		turns := 1
		if o.Turns > 1 {
			p := 1 / o.Turns // geometric on 1, 2, … with mean Turns
			turns = int(math.Ceil(math.Log(1-rng.Float64()) / math.Log1p(-p)))
			turns = max(1, turns)
		}
		context := o.SystemTokens + length(o.FirstTokens)
		at := t
		for turn := 0; turn < turns && at < end; turn++ {
			if turn > 0 {
				context += length(o.TurnTokens)
				if o.ThinkS > 0 {
					at += rng.ExpFloat64() * o.ThinkS
				}
				if at >= end {
					break
				}
			}
			if o.MaxContextTokens > 0 && context > o.MaxContextTokens {
				break
			}
			out0 := length(o.OutputTokens)
			if at < 0 {
				context += out0
				continue
			}
			r := Request{At: time.Duration(at * float64(time.Second)), PromptTokens: context, OutputTokens: out0}
			r.Blocks = sessionBlocks(o.Salt, uint64(tenant), session, o.SystemTokens, context)
			if o.SessionIDs {
				r.Session = session
			}
			out = append(out, r)
			context += r.OutputTokens
		}
	}
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return out, nil
}

// sessionBlocks names the blocks of a prompt of n tokens of a session whose
// tenant's system prompt is sys tokens long (see SessionOptions).
func sessionBlocks(salt, tenant, session uint64, sys, n int) []uint64 {
	nb := (n + BlockTokens - 1) / BlockTokens
	out := make([]uint64, nb)
	for b := range out {
		endTok := (b + 1) * BlockTokens
		switch {
		case endTok <= sys:
			out[b] = mixID(salt ^ mixID(tenant<<20|uint64(b)))
		case endTok <= n:
			out[b] = mixID(session ^ mixID(uint64(b)+1))
		default: // the partial last block: its content is this prompt's own
			out[b] = mixID(session ^ mixID(uint64(n)<<20|uint64(b)) ^ 0xb10c)
		}
	}
	return out
}

// mixID is the splitmix64 finaliser: a bijection that spreads ids (the
// same function as router/selection.Mix64, which this package, importing
// nothing of ours, cannot use).
func mixID(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
