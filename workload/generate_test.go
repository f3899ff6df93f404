package workload

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"
)

func family(t *testing.T, name string, rate float64, d time.Duration) SessionOptions {
	t.Helper()
	o, err := GeneratorDefaults(name)
	if err != nil {
		t.Fatal(err)
	}
	o.Rate, o.Duration, o.Seed = rate, d, 7
	return o
}

func sessions(t *testing.T, o SessionOptions) []Request {
	t.Helper()
	reqs, err := Sessions(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) == 0 {
		t.Fatal("no requests")
	}
	return reqs
}

// TestSessionsDeterministic checks that a generator is pure: the same
// options give the same requests, another seed others, and arrivals are
// sorted with blocks that match the prompt length.
func TestSessionsDeterministic(t *testing.T) {
	for _, f := range Families() {
		o := family(t, f, 20, 60*time.Second)
		a, b := sessions(t, o), sessions(t, o)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs with the same options differ", f)
		}
		o.Seed++
		if c := sessions(t, o); reflect.DeepEqual(a, c) {
			t.Fatalf("%s: another seed gives the same requests", f)
		}
		for k, r := range a {
			if k > 0 && r.At < a[k-1].At {
				t.Fatalf("%s: request %d at %v before %v", f, k, r.At, a[k-1].At)
			}
			if want := (r.PromptTokens + BlockTokens - 1) / BlockTokens; len(r.Blocks) != want || r.Session != 0 {
				t.Fatalf("%s: request %d: %d blocks for %d tokens (want %d), session %d", f, k, len(r.Blocks), r.PromptTokens, want, r.Session)
			}
		}
	}
}

// TestChatSharesSystemPrompt checks the chat family's defining property:
// every request's first SystemTokens/512 blocks are the one shared system
// prompt, and the block after it is no longer shared.
func TestChatSharesSystemPrompt(t *testing.T) {
	o := family(t, "chat", 30, 120*time.Second)
	reqs := sessions(t, o)
	nsys := o.SystemTokens / BlockTokens
	if nsys < 4 || o.SystemTokens < 2048 {
		t.Fatalf("chat's system prompt %d tokens, %d blocks: want > 2 KiB and several blocks", o.SystemTokens, nsys)
	}
	after := map[uint64]int{}
	for _, r := range reqs {
		for b := 0; b < nsys; b++ {
			if r.Blocks[b] != reqs[0].Blocks[b] {
				t.Fatalf("request at %v: block %d differs from the shared prompt's", r.At, b)
			}
		}
		after[r.Blocks[nsys]]++
	}
	if len(after) < len(reqs)/int(2*o.Turns) {
		t.Fatalf("%d distinct blocks after the system prompt over %d requests: conversations share them", len(after), len(reqs))
	}
}

// TestTenantsOwnPrompts checks the tenants family: requests lead with their
// tenant's prompt, many tenants appear, and the most popular one carries a
// Zipf-like share.
func TestTenantsOwnPrompts(t *testing.T) {
	o := family(t, "tenants", 50, 300*time.Second)
	reqs := sessions(t, o)
	nsys := o.SystemTokens / BlockTokens
	count := map[uint64]int{}
	for _, r := range reqs {
		count[r.Blocks[0]]++
		if nsys > 1 && r.Blocks[1] == r.Blocks[0] {
			t.Fatal("a system prompt's blocks repeat an id")
		}
	}
	top := 0
	for _, n := range count {
		top = max(top, n)
	}
	// Zipf(1) over 200 tenants: the first holds 1/H(200) ≈ 17% of sessions.
	share := float64(top) / float64(len(reqs))
	if len(count) < 50 || share < 0.08 || share > 0.35 {
		t.Fatalf("%d tenants seen, the most popular with %.1f%% of requests: want ≥ 50 and ~17%%", len(count), 100*share)
	}
}

// TestAgenticContextGrows checks the agentic family: each step of a loop
// resends the previous prompt and output plus a tool result, so its prompt
// grows by at least the previous output, and on average by about
// TurnTokens + OutputTokens; every full block of the previous step is kept.
func TestAgenticContextGrows(t *testing.T) {
	o := family(t, "agentic", 20, 120*time.Second)
	o.Exponential = false
	reqs := sessions(t, o)
	// Steps of one loop share their (session-specific) block after the
	// tool-definition prompt.
	nsys := o.SystemTokens / BlockTokens
	last := map[uint64]Request{}
	var growth []float64
	for _, r := range reqs {
		key := r.Blocks[nsys]
		if p, ok := last[key]; ok {
			growth = append(growth, float64(r.PromptTokens-p.PromptTokens))
			full := p.PromptTokens / BlockTokens
			for b := 0; b < full; b++ {
				if r.Blocks[b] != p.Blocks[b] {
					t.Fatalf("step at %v lost block %d of the previous step", r.At, b)
				}
			}
		}
		last[key] = r
	}
	if len(growth) < 100 {
		t.Fatalf("only %d continued steps", len(growth))
	}
	want := float64(o.TurnTokens + o.OutputTokens)
	for _, g := range growth {
		if g != want {
			t.Fatalf("context grew by %v tokens, want %v (tool result + previous output)", g, want)
		}
	}
}

// TestCodePrefillHeavy checks the code family: prompts are many times the
// output (prefill-heavy).
func TestCodePrefillHeavy(t *testing.T) {
	o := family(t, "code", 50, 60*time.Second)
	reqs := sessions(t, o)
	var in, out float64
	for _, r := range reqs {
		in += float64(r.PromptTokens)
		out += float64(r.OutputTokens)
	}
	if in/out < 50 {
		t.Fatalf("prompt/output %.0f: want prefill-heavy (≥ 50)", in/out)
	}
}

// TestRateModulation checks the rate models: the flash bursts' factor and
// the diurnal swing appear in the arrivals.
func TestRateModulation(t *testing.T) {
	o := family(t, "code", 40, 240*time.Second)
	o.Turns, o.ThinkS = 1, 0 // one request per session: arrivals follow the start rate
	o.Bursts = Bursts{EveryS: 60, BurstS: 10, StartS: 30, Factor: 4}
	reqs := sessions(t, o)
	var in, outside float64
	for _, r := range reqs {
		s := r.At.Seconds()
		if s >= 30 && math.Mod(s-30, 60) < 10 {
			in++
		} else {
			outside++
		}
	}
	// 4 bursts of 10 s against 200 s outside them.
	if f := (in / 40) / (outside / 200); f < 3.3 || f > 4.8 {
		t.Fatalf("burst factor %.2f, want ~4", f)
	}
	o.Bursts = Bursts{}
	o.Diurnal = Diurnal{PeriodS: 240, Amplitude: 0.8}
	reqs = sessions(t, o)
	var peak, trough float64
	for _, r := range reqs {
		switch s := r.At.Seconds(); {
		case s < 120:
			peak++
		default:
			trough++
		}
	}
	// ∫ 1 ± 0.8·sin over half periods: (1 + 0.8·2/π) / (1 − 0.8·2/π) ≈ 3.07.
	if f := peak / trough; f < 2.5 || f > 3.7 {
		t.Fatalf("diurnal peak/trough %.2f, want ~3.1", f)
	}
}

// TestSessionsValidate checks that bad options are refused naming the field.
func TestSessionsValidate(t *testing.T) {
	o := family(t, "chat", 10, time.Minute)
	o.Turns = 0
	if _, err := Sessions(o); !errors.Is(err, ErrGenerator) {
		t.Fatalf("Turns 0: %v, want ErrGenerator", err)
	}
	if _, err := GeneratorDefaults("nope"); !errors.Is(err, ErrGenerator) {
		t.Fatalf("unknown family: %v", err)
	}
}
