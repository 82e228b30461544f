// Command filedeps prints, for Go packages, their size and the dependencies between their
// files: file A depends on file B when A uses a package-level name (function, type, method,
// variable, constant) declared in B. It reports each package's non-test lines and files,
// the edges between its files, and its largest knot: the biggest set of files that all
// reach each other (a strongly connected component), which cannot be understood or moved
// one file at a time.
//
//	go run ./scripts/filedeps [-edges] DIR...
//
// Imports are not resolved (only names declared inside the package matter), so it needs no
// build and runs on any checkout.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

func main() {
	edges := flag.Bool("edges", false, "print every file's dependencies")
	flag.Parse()
	for _, dir := range flag.Args() {
		if err := report(dir, *edges); err != nil {
			fmt.Fprintln(os.Stderr, "filedeps:", err)
			os.Exit(1)
		}
	}
}

// fakeImporter gives every import an empty package: selectors on it do not resolve, which
// does not matter for names declared in the package itself.
type fakeImporter struct{}

func (fakeImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}

func report(dir string, printEdges bool) error {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	var files []*ast.File
	lines := 0
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, f)
		lines += fset.File(f.Pos()).LineCount()
	}
	if len(files) == 0 {
		return nil
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: fakeImporter{}, Error: func(error) {}}
	pkg, _ := conf.Check(files[0].Name.Name, fset, files, info)
	fileOf := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	deps := map[string]map[string]bool{}
	add := func(from token.Pos, obj types.Object) {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			return
		}
		if obj.Parent() != pkg.Scope() && !isMethodOrField(obj) {
			return
		}
		a, b := fileOf(from), fileOf(obj.Pos())
		if a == b {
			return
		}
		if deps[a] == nil {
			deps[a] = map[string]bool{}
		}
		deps[a][b] = true
	}
	for id, obj := range info.Uses {
		add(id.Pos(), obj)
	}
	for sel, s := range info.Selections {
		add(sel.Pos(), s.Obj())
	}
	var all []string
	for _, f := range files {
		all = append(all, fileOf(f.Pos()))
	}
	sort.Strings(all)
	n := 0
	for _, d := range deps {
		n += len(d)
	}
	knot := largestSCC(all, deps)
	fmt.Printf("%s: %d files, %d lines, %d file dependencies, largest knot %d files", dir, len(all), lines, n, len(knot))
	if len(knot) > 1 {
		fmt.Printf(" (%s)", strings.Join(knot, " "))
	}
	fmt.Println()
	if printEdges {
		for _, a := range all {
			fmt.Printf("  %s -> %s\n", a, strings.Join(slices.Sorted(mapKeys(deps[a])), " "))
		}
	}
	return nil
}

func isMethodOrField(obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Func:
		return o.Type().(*types.Signature).Recv() != nil
	case *types.Var:
		return o.IsField()
	}
	return false
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// largestSCC returns the biggest strongly connected component of the file graph (Tarjan).
func largestSCC(nodes []string, deps map[string]map[string]bool) []string {
	index, low := map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack, best []string
	next := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, w := range slices.Sorted(mapKeys(deps[v])) {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			if len(comp) > len(best) {
				sort.Strings(comp)
				best = comp
			}
		}
	}
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return best
}
