package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// jinja2Render is transformers' apply_chat_template environment (a
// sandbox with trim_blocks, lstrip_blocks and loop controls, its tojson,
// raise_exception and strftime_now), reading {"template", "context"}
// pairs on stdin and printing each rendering (or "RENDER ERROR") as JSON.
const jinja2Render = `
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
out = []
for case in json.load(sys.stdin):
    try:
        out.append(env.from_string(case["template"]).render(**case["context"]))
    except Exception as e:
        out.append("RENDER ERROR")
json.dump(out, sys.stdout)
`

// TestTemplatesAgainstJinja2 renders chat templates with this package and
// with Python's Jinja2 as transformers sets it up, and compares the text,
// when TOKENIZE_JINJA2_PYTHON names a Python that has jinja2 (CI has none).
// The templates are the fixture's and the real models' that the template
// engine's module ships in its testdata (Llama-3.2, Qwen3, Mistral, ...).
func TestTemplatesAgainstJinja2(t *testing.T) {
	python := os.Getenv("TOKENIZE_JINJA2_PYTHON")
	if python == "" {
		t.Skip("TOKENIZE_JINJA2_PYTHON is not set (a python3 with jinja2)")
	}
	templates := map[string]string{"fixture": fixtureTemplate}
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ardanlabs/jinja").Output(); err == nil {
		files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "testdata", "templates", "*.jinja"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			templates[filepath.Base(f)] = string(data)
		}
	}
	requests := []string{
		`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi!"}]}`,
		`{"messages":[{"role":"user","content":"  one\ntwo  "},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}],"add_generation_prompt":true}`,
		`{"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}]}`,
		`{"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"{\"temp\": 21}"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`,
		`{"messages":[{"role":"system","content":"Système: réponds en français 🙂"},{"role":"user","content":"Bonjour"}],"add_generation_prompt":false}`,
	}
	type job struct {
		Template string          `json:"template"`
		Context  json.RawMessage `json:"context"`
	}
	var jobs []job
	var got []string
	var names []string
	specials := map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
	for _, name := range sortedKeys(templates) {
		ct, err := compileChat(name, templates[name], specials)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		tok := &Tokenizer{m: loadFixture(t).m, chat: ct, maxInput: DefaultMaxInputBytes}
		for i, body := range requests {
			var req ChatRequest
			if err := json.Unmarshal([]byte(body), &req); err != nil {
				t.Fatal(err)
			}
			// Python renders from the very values this package's engine
			// gets (messages prepared as vLLM prepares them), in order.
			data, _, err := tok.context(req)
			if err != nil {
				t.Fatal(err)
			}
			out, err := ct.execute(data)
			if err != nil {
				out = "RENDER ERROR: " + err.Error()
			}
			var ctx strings.Builder
			ctx.WriteByte('{')
			for k, key := range sortedValueKeys(data) {
				if k > 0 {
					ctx.WriteByte(',')
				}
				kb, _ := json.Marshal(key)
				ctx.Write(kb)
				ctx.WriteByte(':')
				writeValueJSON(&ctx, data[key])
			}
			ctx.WriteByte('}')
			jobs = append(jobs, job{Template: templates[name], Context: json.RawMessage(ctx.String())})
			got = append(got, out)
			names = append(names, fmt.Sprintf("%s/%d", name, i))
		}
	}
	in, err := json.Marshal(jobs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-c", jinja2Render)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	compared, differ := 0, 0
	for k, name := range names {
		if want[k] == "RENDER ERROR" || strings.HasPrefix(got[k], "RENDER ERROR") {
			if (want[k] == "RENDER ERROR") != strings.HasPrefix(got[k], "RENDER ERROR") {
				t.Logf("%s: Jinja2 says %.40q, this package %.80q", name, want[k], got[k])
			}
			continue
		}
		compared++
		if got[k] != want[k] {
			differ++
			tmpl := templates[name[:strings.LastIndexByte(name, '/')]]
			if strings.Contains(tmpl, "tojson(indent") && strings.Contains(requests[name[len(name)-1]-'0'], `"tools"`) {
				// A known limit (docs/kv-events.md): the engine's
				// indented tojson sorts keys.
				t.Logf("%s differs (known: indented tojson sorts keys) at byte %s", name, firstDiff(got[k], want[k]))
				continue
			}
			t.Errorf("%s differs at byte %s", name, firstDiff(got[k], want[k]))
		}
	}
	t.Logf("%d renderings compared, %d differ", compared, differ)
}

// writeValueJSON writes a template value as JSON, dicts in their order.
func writeValueJSON(sb *strings.Builder, v jinja.Value) {
	switch {
	case v.IsDict():
		d := v.AsDict()
		sb.WriteByte('{')
		for i, k := range d.OrderedKeys() {
			if i > 0 {
				sb.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			sb.Write(kb)
			sb.WriteByte(':')
			x, _ := d.Get(k)
			writeValueJSON(sb, x)
		}
		sb.WriteByte('}')
	case v.IsList():
		l := v.AsList()
		sb.WriteByte('[')
		for i := 0; i < l.Len(); i++ {
			if i > 0 {
				sb.WriteByte(',')
			}
			writeValueJSON(sb, l.Get(i))
		}
		sb.WriteByte(']')
	case v.IsString():
		b, _ := json.Marshal(v.AsString())
		sb.Write(b)
	case v.IsInt():
		fmt.Fprint(sb, v.AsInt())
	case v.IsFloat():
		b, _ := json.Marshal(v.AsFloat())
		sb.Write(b)
	case v.IsBool():
		fmt.Fprint(sb, v.AsBool())
	default:
		sb.WriteString("null")
	}
}

func sortedValueKeys(m map[string]jinja.Value) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// firstDiff shows where two texts part.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-40)
	return fmt.Sprintf("%d: ...%q then\n got %q\nwant %q", i, a[from:i], a[i:min(len(a), i+60)], b[i:min(len(b), i+60)])
}
