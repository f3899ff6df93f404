// Package archtest keeps docs/architecture.md's dependency rules true. It
// reads two tables of that page — which packages of ours each folder may
// import, and what a package must not link at all — and checks them
// against the package graph the go command reports (go list -deps -json),
// so that the page and the rule cannot drift apart: a new import the table
// forbids, a package in no row, or a row that names no package fails the
// test in this package.
package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// The headings of the two tables in docs/architecture.md.
const (
	// ImportsHeading heads the table of folders and what they may import.
	ImportsHeading = "Packages and what they may import"
	// LinksHeading heads the table of what a package must not link.
	LinksHeading = "What a package must not link"
)

// ErrTable is wrapped by the errors about a table that cannot be read.
var ErrTable = errors.New("archtest: unreadable table")

// Mode is how a row's "may import" cell reads.
type Mode int

// The forms of a "may import" cell.
const (
	// Listed allows exactly the packages named in backticks; "nothing of
	// ours" is Listed with no names.
	Listed Mode = iota
	// Everything allows every package of ours.
	Everything
	// EverythingBut allows every package of ours except the named folders
	// and what lies below them.
	EverythingBut
	// NotGo marks a row that holds no Go package ("—").
	NotGo
)

// Rule is one row of the imports table.
type Rule struct {
	// Folder is the row's folder relative to the module root, without a
	// trailing slash. A package belongs to the row of the longest folder
	// that contains it.
	Folder string
	// Line is the row's line in the document (1-based).
	Line int
	// Cell is the "may import" cell as written.
	Cell string
	// Mode and Names say what the cell allows: Names are the backticked
	// folders of the cell.
	Mode  Mode
	Names []string
}

// LinkRule is one row of the links table.
type LinkRule struct {
	// Package is the package the row is about, relative to the module root.
	Package string
	// Line is the row's line in the document (1-based).
	Line int
	// Forbidden lists what the package must not link, directly or through
	// others: a package of ours (relative path, matched exactly) or an
	// external module or package path (matched with everything below it).
	Forbidden []string
}

// Rules are the two tables of the document.
type Rules struct {
	Imports []Rule
	Links   []LinkRule
}

var backticked = regexp.MustCompile("`([^`]+)`")

// table is one markdown table: its header cells and its rows with their lines.
type table struct {
	header []string
	rows   [][]string
	lines  []int
}

// findTable returns the first table after the "## heading" line.
func findTable(doc []byte, heading string) (*table, error) {
	sc := bufio.NewScanner(bytes.NewReader(doc))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line, inSection := 0, false
	var t *table
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(s, "#") {
			if t != nil {
				break
			}
			inSection = strings.TrimSpace(strings.TrimLeft(s, "#")) == heading
			continue
		}
		if !inSection {
			continue
		}
		if !strings.HasPrefix(s, "|") {
			if t != nil {
				break
			}
			continue
		}
		cells := splitRow(s)
		switch {
		case t == nil:
			t = &table{header: cells}
		case isSeparator(cells):
		default:
			if len(cells) != len(t.header) {
				return nil, fmt.Errorf("%w: %q line %d: %d cells, the header has %d", ErrTable, heading, line, len(cells), len(t.header))
			}
			t.rows = append(t.rows, cells)
			t.lines = append(t.lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("archtest: read document: %w", err)
	}
	if t == nil {
		return nil, fmt.Errorf("%w: no table under the heading %q", ErrTable, heading)
	}
	return t, nil
}

func splitRow(s string) []string {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "|"), "|")
	cells := strings.Split(s, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

func isSeparator(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, "-: ") != "" {
			return false
		}
	}
	return true
}

func (t *table) column(heading, name string) (int, error) {
	for i, h := range t.header {
		if strings.EqualFold(h, name) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: %q has no column %q (columns %q)", ErrTable, heading, name, t.header)
}

func names(cell string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(m[1], "./"), "/"))
	}
	return out
}

// Parse reads the two tables of doc (docs/architecture.md).
func Parse(doc []byte) (*Rules, error) {
	it, err := findTable(doc, ImportsHeading)
	if err != nil {
		return nil, err
	}
	fc, err := it.column(ImportsHeading, "folder")
	if err != nil {
		return nil, err
	}
	mc, err := it.column(ImportsHeading, "may import")
	if err != nil {
		return nil, err
	}
	r := &Rules{}
	seen := map[string]int{}
	for k, row := range it.rows {
		line := it.lines[k]
		folders := names(row[fc])
		if len(folders) == 0 {
			return nil, fmt.Errorf("%w: line %d: folder cell %q names no folder in backticks", ErrTable, line, row[fc])
		}
		rule := Rule{Folder: folders[0], Line: line, Cell: row[mc]}
		if prev, dup := seen[rule.Folder]; dup {
			return nil, fmt.Errorf("%w: line %d: folder %s already has the row on line %d", ErrTable, line, rule.Folder, prev)
		}
		seen[rule.Folder] = line
		cell := strings.ToLower(strings.TrimSpace(row[mc]))
		rule.Names = names(row[mc])
		switch {
		case cell == "—" || cell == "-" || cell == "–":
			rule.Mode = NotGo
		case strings.HasPrefix(cell, "nothing of ours"):
			rule.Mode, rule.Names = Listed, nil
		case strings.HasPrefix(cell, "everything but"):
			rule.Mode = EverythingBut
			if len(rule.Names) == 0 {
				return nil, fmt.Errorf("%w: line %d: %q names no folder in backticks", ErrTable, line, row[mc])
			}
		case cell == "everything":
			rule.Mode = Everything
		default:
			rule.Mode = Listed
			if len(rule.Names) == 0 {
				return nil, fmt.Errorf("%w: line %d: may-import cell %q is none of: backticked packages, \"nothing of ours\", \"everything\", \"everything but ...\", \"—\"", ErrTable, line, row[mc])
			}
		}
		r.Imports = append(r.Imports, rule)
	}

	lt, err := findTable(doc, LinksHeading)
	if err != nil {
		return nil, err
	}
	pc, err := lt.column(LinksHeading, "package")
	if err != nil {
		return nil, err
	}
	nc, err := lt.column(LinksHeading, "must not link")
	if err != nil {
		return nil, err
	}
	for k, row := range lt.rows {
		line := lt.lines[k]
		pkgs, forbidden := names(row[pc]), names(row[nc])
		if len(pkgs) != 1 || len(forbidden) == 0 {
			return nil, fmt.Errorf("%w: line %d: want one package in backticks and what it must not link in backticks, got %q | %q", ErrTable, line, row[pc], row[nc])
		}
		r.Links = append(r.Links, LinkRule{Package: pkgs[0], Line: line, Forbidden: forbidden})
	}
	return r, nil
}

// Package is one node of the package graph, as go list -json reports it.
type Package struct {
	// ImportPath is the package's full import path.
	ImportPath string
	// Imports are the packages its non-test files import.
	Imports []string
	// Deps are all the packages it links, transitively.
	Deps []string
}

// ReadPackages decodes the output of go list -deps -json: one JSON object
// per package.
func ReadPackages(r io.Reader) ([]Package, error) {
	dec := json.NewDecoder(r)
	var out []Package
	for {
		var p Package
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("archtest: decode go list output after %d packages: %w", len(out), err)
		}
		out = append(out, p)
	}
}

// Violation is one way the graph breaks the document's rules.
type Violation struct {
	// Package is the package at fault (relative to the module root).
	Package string
	// Imported is the package it imports or links against the rule, if any.
	Imported string
	// Line is the line of the rule in the document (0: no row applies).
	Line int
	// Problem says what is wrong, naming the row.
	Problem string
}

// String renders the violation with the document line of its rule.
func (v Violation) String() string {
	if v.Line > 0 {
		return fmt.Sprintf("docs/architecture.md:%d: %s", v.Line, v.Problem)
	}
	return "docs/architecture.md: " + v.Problem
}

// under reports whether path is folder or lies below it.
func under(path, folder string) bool {
	return folder == "" || folder == "." || path == folder || strings.HasPrefix(path, folder+"/")
}

// rowFor returns the row of the longest folder that contains rel.
func (r *Rules) rowFor(rel string) *Rule {
	var best *Rule
	for i := range r.Imports {
		ru := &r.Imports[i]
		if under(rel, ru.Folder) && (best == nil || len(ru.Folder) > len(best.Folder)) {
			best = ru
		}
	}
	return best
}

func (ru *Rule) allows(rel string) bool {
	switch ru.Mode {
	case Everything:
		return true
	case EverythingBut:
		for _, n := range ru.Names {
			if under(rel, n) {
				return false
			}
		}
		return true
	case Listed:
		for _, n := range ru.Names {
			if rel == n {
				return true
			}
		}
	}
	return false
}

func (ru *Rule) describe() string {
	return fmt.Sprintf("the row of `%s/` (may import: %s)", ru.Folder, ru.Cell)
}

// Check returns every violation of rules by pkgs, the packages of module
// and all they link (go list -deps -json ./...), sorted by line and
// package.
func Check(module string, rules *Rules, pkgs []Package) []Violation {
	byPath := make(map[string]*Package, len(pkgs))
	for i := range pkgs {
		byPath[pkgs[i].ImportPath] = &pkgs[i]
	}
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	var ours []string
	for _, p := range pkgs {
		if r, ok := rel(p.ImportPath); ok {
			ours = append(ours, r)
		}
	}
	sort.Strings(ours)
	var out []Violation
	used := map[*Rule]bool{}
	for _, r := range ours {
		p := byPath[module+"/"+r]
		if r == "." {
			p = byPath[module]
		}
		row := rules.rowFor(r)
		switch {
		case row == nil:
			out = append(out, Violation{Package: r, Problem: fmt.Sprintf("package %s is in no row of the table %q: add one", r, ImportsHeading)})
			continue
		case row.Mode == NotGo:
			out = append(out, Violation{Package: r, Line: row.Line, Problem: fmt.Sprintf("package %s falls in %s, which says it holds no Go package", r, row.describe())})
			continue
		}
		used[row] = true
		for _, imp := range p.Imports {
			q, ok := rel(imp)
			if !ok || q == r || row.allows(q) {
				continue
			}
			out = append(out, Violation{Package: r, Imported: q, Line: row.Line,
				Problem: fmt.Sprintf("%s imports %s, which %s does not allow", r, q, row.describe())})
		}
	}
	isOurs := func(name string) bool {
		for _, r := range ours {
			if under(r, name) {
				return true
			}
		}
		return false
	}
	for i := range rules.Imports {
		ru := &rules.Imports[i]
		if ru.Mode == NotGo {
			continue
		}
		if !used[ru] {
			out = append(out, Violation{Line: ru.Line, Problem: fmt.Sprintf("the row of `%s/` holds no package: remove it or fix the folder", ru.Folder)})
		}
		for _, n := range ru.Names {
			exact := false
			for _, r := range ours {
				exact = exact || r == n
			}
			if (ru.Mode == Listed && !exact) || (ru.Mode == EverythingBut && !isOurs(n)) {
				out = append(out, Violation{Line: ru.Line, Problem: fmt.Sprintf("%s names `%s`, which is no package of ours", ru.describe(), n)})
			}
		}
	}
	for _, lr := range rules.Links {
		p, ok := byPath[module+"/"+lr.Package]
		if !ok {
			out = append(out, Violation{Package: lr.Package, Line: lr.Line, Problem: fmt.Sprintf("the links row names `%s`, which is no package of ours", lr.Package)})
			continue
		}
		for _, f := range lr.Forbidden {
			external := strings.Contains(strings.SplitN(f, "/", 2)[0], ".")
			for _, d := range p.Deps {
				hit := false
				if external {
					hit = d == f || strings.HasPrefix(d, f+"/")
				} else {
					hit = d == module+"/"+f
				}
				if !hit {
					continue
				}
				chain := shortChain(byPath, p.ImportPath, d)
				for k := range chain {
					if r, ok := rel(chain[k]); ok {
						chain[k] = r
					}
				}
				dd := d
				if r, ok := rel(d); ok {
					dd = r
				}
				out = append(out, Violation{Package: lr.Package, Imported: dd, Line: lr.Line,
					Problem: fmt.Sprintf("%s links %s (%s), which its row of %q forbids (%s)", lr.Package, dd, strings.Join(chain, " → "), LinksHeading, f)})
				break // one violation per forbidden entry is enough to act on
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Line != out[b].Line {
			return out[a].Line < out[b].Line
		}
		if out[a].Package != out[b].Package {
			return out[a].Package < out[b].Package
		}
		return out[a].Imported < out[b].Imported
	})
	return out
}

// shortChain returns a shortest import chain from one package to another
// (both included), or just the two when the graph does not connect them.
func shortChain(byPath map[string]*Package, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var chain []string
			for n := to; n != ""; n = prev[n] {
				chain = append(chain, n)
			}
			for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
				chain[i], chain[j] = chain[j], chain[i]
			}
			return chain
		}
		p := byPath[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return []string{from, to}
}
