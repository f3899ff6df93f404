package archtest

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// moduleRoot returns the directory of go.mod above the test's directory and
// the module path it declares.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("%s/go.mod declares no module", dir)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = up
	}
}

// TestArchitectureTable checks the whole module against
// docs/architecture.md's tables.
func TestArchitectureTable(t *testing.T) {
	root, module := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules.Imports) < 10 || len(rules.Links) == 0 {
		t.Fatalf("parsed %d import rows and %d link rows: the tables were not found whole", len(rules.Imports), len(rules.Links))
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-deps", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -json ./...: %v\n%s", err, stderr.String())
	}
	pkgs, err := ReadPackages(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	ours := 0
	for _, p := range pkgs {
		if p.ImportPath == module || strings.HasPrefix(p.ImportPath, module+"/") {
			ours++
		}
	}
	t.Logf("go list: %d packages, %d of ours, in %s", len(pkgs), ours, time.Since(start).Round(time.Millisecond))
	if ours < 10 {
		t.Fatalf("go list reported %d packages of module %s", ours, module)
	}
	for _, v := range Check(module, rules, pkgs) {
		t.Error(v)
	}
}

// fakeDoc is a small architecture page with both tables.
const fakeDoc = "# Architecture\n\n" +
	"## " + ImportsHeading + "\n\n" +
	"| folder | what lives there | may import |\n" +
	"|---|---|---|\n" +
	"| `wire/` | wire types | nothing of ours |\n" +
	"| `bus/` | the bus layout | `wire` |\n" +
	"| `bus/server/` | the embedded server | nothing of ours |\n" +
	"| `front/` | the data plane | `wire`, `bus`, `front/pick` (selection), `plan` types only |\n" +
	"| `front/pick/` | pure selection | nothing of ours |\n" +
	"| `plan/` | the planner | nothing of ours |\n" +
	"| `svc/planner/` | the planning service | `wire`, `bus`, `plan`, `front/pick` |\n" +
	"| `stack/` | the in-process stack | everything but `cmd` |\n" +
	"| `compose.yml` | not Go | — |\n" +
	"| `cmd/tool/` | the binary | everything |\n\n" +
	"Some prose.\n\n" +
	"## " + LinksHeading + "\n\n" +
	"| package | must not link | why |\n" +
	"|---|---|---|\n" +
	"| `svc/planner` | `example.org/httpstack`, `front` | plans only |\n" +
	"| `front` | `example.org/server` | a client |\n\n" +
	"## Conventions\n"

const mod = "example.com/m"

func pkg(rel string, imports ...string) Package {
	p := Package{ImportPath: mod + "/" + rel}
	for _, i := range imports {
		if !strings.Contains(strings.SplitN(i, "/", 2)[0], ".") {
			i = mod + "/" + i
		}
		p.Imports = append(p.Imports, i)
	}
	return p
}

// graph completes Deps from Imports, transitively, as go list reports them.
func graph(ps ...Package) []Package {
	by := map[string]*Package{}
	for i := range ps {
		by[ps[i].ImportPath] = &ps[i]
	}
	var deps func(string, map[string]bool)
	deps = func(path string, seen map[string]bool) {
		p := by[path]
		if p == nil {
			return
		}
		for _, i := range p.Imports {
			if !seen[i] {
				seen[i] = true
				deps(i, seen)
			}
		}
	}
	for i := range ps {
		seen := map[string]bool{}
		deps(ps[i].ImportPath, seen)
		for d := range seen {
			ps[i].Deps = append(ps[i].Deps, d)
		}
	}
	return ps
}

// clean is a graph that keeps every rule of fakeDoc.
func clean() []Package {
	return []Package{
		pkg("wire"),
		pkg("bus", "wire", "example.org/client"),
		pkg("bus/server", "example.org/server"),
		pkg("front/pick"),
		pkg("front", "wire", "bus", "front/pick", "plan", "example.org/httpstack"),
		pkg("plan"),
		pkg("svc/planner", "wire", "bus", "plan", "front/pick"),
		pkg("stack", "front", "svc/planner", "bus/server"),
		pkg("cmd/tool", "stack", "bus/server"),
		{ImportPath: "example.org/client"},
		{ImportPath: "example.org/server", Imports: []string{"example.org/server/internal"}},
		{ImportPath: "example.org/server/internal"},
		{ImportPath: "example.org/httpstack"},
	}
}

// TestCheck: a graph that keeps the rules passes; each kind of breach is
// reported once, naming the package at fault, what it imports or links,
// and the row (by line and folder).
func TestCheck(t *testing.T) {
	rules, err := Parse([]byte(fakeDoc))
	if err != nil {
		t.Fatal(err)
	}
	if v := Check(mod, rules, graph(clean()...)); len(v) != 0 {
		t.Fatalf("clean graph: %v", v)
	}
	edit := func(f func(ps []Package) []Package) []Package { return graph(f(clean())...) }
	add := func(ps []Package, rel string, imports ...string) []Package {
		for i := range ps {
			if ps[i].ImportPath == mod+"/"+rel {
				ps[i].Imports = append(ps[i].Imports, pkg(rel, imports...).Imports...)
				return ps
			}
		}
		return append(ps, pkg(rel, imports...))
	}
	for _, c := range []struct {
		name string
		pkgs []Package
		// want are substrings of the one violation expected.
		want []string
	}{
		{"listed row, unlisted import", edit(func(ps []Package) []Package { return add(ps, "wire", "bus") }),
			[]string{"docs/architecture.md:7:", "wire imports bus", "`wire/`", "nothing of ours"}},
		{"subpackage's own row is stricter than its parent's", edit(func(ps []Package) []Package { return add(ps, "front/pick", "wire") }),
			[]string{":11:", "front/pick imports wire", "`front/pick/`"}},
		{"a subpackage is not allowed by its parent's name", edit(func(ps []Package) []Package { return add(ps, "svc/planner", "bus/server") }),
			[]string{":13:", "svc/planner imports bus/server", "`svc/planner/`"}},
		{"everything but", edit(func(ps []Package) []Package { return add(ps, "stack", "cmd/tool") }),
			[]string{":14:", "stack imports cmd/tool", "everything but `cmd`"}},
		{"package in no row", edit(func(ps []Package) []Package { return add(ps, "extra", "wire") }),
			[]string{"package extra is in no row"}},
		{"package in a row that holds no Go", edit(func(ps []Package) []Package { return add(ps, "compose.yml/x") }),
			[]string{":15:", "compose.yml/x", "holds no Go package"}},
		{"forbidden link through an allowed import", edit(func(ps []Package) []Package { return add(ps, "bus", "example.org/server/internal") }),
			[]string{":25:", "front links example.org/server/internal", "front → bus → example.org/server/internal", "(example.org/server)"}},
		{"forbidden link of ours", edit(func(ps []Package) []Package { return add(ps, "plan", "front") }),
			[]string{":24:", "svc/planner links front", "svc/planner → plan → front"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			vs := Check(mod, rules, c.pkgs)
			var found []string
			for _, v := range vs {
				found = append(found, v.String())
			}
			hit := 0
			for _, s := range found {
				all := true
				for _, w := range c.want {
					all = all && strings.Contains(s, w)
				}
				if all {
					hit++
				}
			}
			if hit != 1 {
				t.Fatalf("want one violation with %q, got %q", c.want, found)
			}
		})
	}
	// A row that holds no package, and a name that is no package of ours.
	ps := clean()
	for i := range ps {
		if ps[i].ImportPath == mod+"/plan" {
			ps = append(ps[:i], ps[i+1:]...)
			break
		}
	}
	for i := range ps {
		ps[i].Imports = strings.Fields(strings.ReplaceAll(strings.Join(ps[i].Imports, " "), mod+"/plan", ""))
	}
	vs := Check(mod, rules, graph(ps...))
	var msgs []string
	for _, v := range vs {
		msgs = append(msgs, v.String())
	}
	joined := strings.Join(msgs, "\n")
	for _, w := range []string{"the row of `plan/` holds no package", "names `plan`, which is no package of ours"} {
		if !strings.Contains(joined, w) {
			t.Errorf("without package plan: want %q among %q", w, msgs)
		}
	}
}

// TestParseRejects: a table the checker cannot read is an error naming
// the line, never a rule that allows or forbids by accident.
func TestParseRejects(t *testing.T) {
	row := "| `bus/` | the bus layout | `wire` |\n"
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"no imports table", "## " + ImportsHeading, "## Something else", "no table under the heading"},
		{"no links table", "## " + LinksHeading, "## Links", "no table under the heading"},
		{"prose in the may-import cell", row, "| `bus/` | the bus layout | the wire types |\n", "line 8"},
		{"folder without backticks", row, "| bus/ | the bus layout | `wire` |\n", "names no folder"},
		{"duplicate folder", row, row + row, "already has the row on line 8"},
		{"everything but nothing", row, "| `bus/` | the bus layout | everything but cmd |\n", "names no folder"},
		{"missing cell", row, "| `bus/` | `wire` |\n", "2 cells, the header has 3"},
		{"links row without a package", "| `front` | `example.org/server` | a client |\n", "| front | `example.org/server` | a client |\n", "want one package"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(fakeDoc, c.from) {
				t.Fatalf("fake document lacks %q", c.from)
			}
			_, err := Parse([]byte(strings.Replace(fakeDoc, c.from, c.to, 1)))
			if !errors.Is(err, ErrTable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrTable containing %q", err, c.want)
			}
		})
	}
}
