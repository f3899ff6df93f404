package messages

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// modelIDs are ids as OpenAI clients, vLLM, SGLang, Ollama and fine-tunes
// name models, with the token each maps to.
var modelIDs = []struct{ id, token string }{
	{"llama", "llama"},
	{"Llama-3_8B", "Llama-3_8B"},
	{"meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3=2E1-8B-Instruct"},
	{"Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2=2E5-0=2E5B-Instruct"},
	{"ft:gpt-4o-mini-2024-07-18:acme::9xYz", "ft=3Agpt-4o-mini-2024-07-18=3Aacme=3A=3A9xYz"},
	{"llama3.1:8b", "llama3=2E1=3A8b"},
	{"model@v2", "model=40v2"},
	{"a=b", "a=3Db"},
	{"=3D", "=3D3D"},
	{"*", "=2A"},
	{">", "=3E"},
	{"gpt-4o", "gpt-4o"},
	{"operator", "=6Fperator"},
	{"penalty", "=70enalty"},
	{"rtt", "=72tt"},
	{"operators", "operators"},
	{"RTT", "RTT"},
	{"modèle", "mod=C3=A8le"},
	{"/", "/"},
	{strings.Repeat("x", MaxModelIDLen), strings.Repeat("x", MaxModelIDLen)},
	{strings.Repeat(".", MaxModelIDLen), strings.Repeat("=2E", MaxModelIDLen)},
}

func TestModelToken(t *testing.T) {
	for _, c := range modelIDs {
		if err := CheckModelName(c.id); err != nil {
			t.Errorf("CheckModelName(%q) = %v", c.id, err)
		}
		tok := ModelToken(c.id)
		if tok != c.token {
			t.Errorf("ModelToken(%q) = %q, want %q", c.id, tok, c.token)
		}
		if !ValidModelToken(tok) {
			t.Errorf("ValidModelToken(%q) = false", tok)
		}
		if back, ok := ModelFromToken(tok); !ok || back != c.id {
			t.Errorf("ModelFromToken(%q) = %q, %v, want %q", tok, back, ok, c.id)
		}
	}
}

func TestModelTokenNameIsItself(t *testing.T) {
	// The layout of a model whose id is a name is unchanged, and building
	// its token allocates nothing.
	id := "Llama-3_8B-Instruct"
	if n := testing.AllocsPerRun(100, func() { _ = ModelToken(id) }); n != 0 {
		t.Errorf("ModelToken of a name allocates %v times", n)
	}
}

func TestModelIDRefused(t *testing.T) {
	for _, s := range []string{"", "a b", "a\tb", "a\nb", "\x00", "a\x7f", "a\u00a0b", "a\u2028b", "a\u0085b", "\xff", strings.Repeat("x", MaxModelIDLen+1)} {
		if ValidModelName(s) {
			t.Errorf("ValidModelName(%q) = true", s)
		}
		err := CheckModelName(s)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "model id") {
			t.Errorf("CheckModelName(%q) = %v, want ErrInvalid saying what is wrong", s, err)
		}
		if _, ok := ModelFromToken(ModelToken(s)); ok {
			t.Errorf("ModelFromToken(ModelToken(%q)) accepted an invalid id", s)
		}
	}
}

func TestModelFromTokenRefusesNonCanonical(t *testing.T) {
	for _, tok := range []string{
		"", "=", "=4", "=4G", "=4a", "a.b", "a b", "a*", ">",
		"=61bc",    // "abc" escapes nothing
		"=2F",      // "/" stands for itself
		"operator", // the reserved word is written "=6Fperator"
		"rtt",      // likewise
		"=20",      // a space: not a model id
		"=C3",      // not UTF-8
		strings.Repeat("x", MaxModelIDLen+1),
	} {
		if id, ok := ModelFromToken(tok); ok {
			t.Errorf("ModelFromToken(%q) = %q, true; want refused", tok, id)
		}
	}
}

// FuzzModelToken checks that every valid id maps to a valid NATS token and
// KV key part that gives the id back, and that distinct ids of the corpus
// never share a token (the mapping is injective because it is reversible;
// the map checks it across the inputs of one run).
func FuzzModelToken(f *testing.F) {
	for _, c := range modelIDs {
		f.Add(c.id)
	}
	seen := map[string]string{}
	f.Fuzz(func(t *testing.T, id string) {
		tok := ModelToken(id)
		if !ValidModelName(id) {
			if back, ok := ModelFromToken(tok); ok {
				t.Fatalf("invalid id %q came back as %q from %q", id, back, tok)
			}
			return
		}
		if !ValidModelToken(tok) || strings.ContainsAny(tok, ". *>\t\r\n") || !utf8.ValidString(tok) {
			t.Fatalf("ModelToken(%q) = %q, not a NATS token", id, tok)
		}
		if reservedToken(tok) {
			t.Fatalf("ModelToken(%q) = %q, a reserved key prefix", id, tok)
		}
		back, ok := ModelFromToken(tok)
		if !ok || back != id {
			t.Fatalf("ModelFromToken(ModelToken(%q)) = %q, %v", id, back, ok)
		}
		if prev, dup := seen[tok]; dup && prev != id {
			t.Fatalf("ids %q and %q share the token %q", prev, id, tok)
		}
		if len(seen) < 1<<16 {
			seen[tok] = id
		}
	})
}

// FuzzModelFromToken checks that whatever token comes off the wire, a
// decoded id is valid and is the one the token stands for.
func FuzzModelFromToken(f *testing.F) {
	for _, c := range modelIDs {
		f.Add(c.token)
	}
	f.Add("=61bc")
	f.Fuzz(func(t *testing.T, tok string) {
		id, ok := ModelFromToken(tok)
		if !ok {
			return
		}
		if !ValidModelName(id) || ModelToken(id) != tok {
			t.Fatalf("ModelFromToken(%q) = %q, which is not valid or maps to %q", tok, id, ModelToken(id))
		}
	})
}
