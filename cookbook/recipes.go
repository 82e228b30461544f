package cookbook

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
)

// registryPath is the file that holds the one list of recipes (RECIPES in registry.py).
const registryPath = "loops_cookbook/registry.py"

var (
	registryBlock = regexp.MustCompile(`(?s)\nRECIPES: dict\[str, str\] = \{\n(.*?)\n\}\n`)
	registryEntry = regexp.MustCompile(`(?m)^\s+"([a-z][a-z0-9_]{0,63})":`)
)

// Recipes lists the recipe names of a cookbook source (the embedded Files, or a folder as
// os.DirFS) in the order registry.py gives them. The list is written once, in Python; this
// reads it from the same file, so a server can refuse a job naming no recipe before it
// starts an interpreter.
func Recipes(src fs.FS) ([]string, error) {
	b, err := fs.ReadFile(src, registryPath)
	if err != nil {
		return nil, fmt.Errorf("cookbook: reading the recipe list: %w", err)
	}
	m := registryBlock.FindSubmatch(b)
	if m == nil {
		return nil, errors.New("cookbook: " + registryPath + " has no RECIPES: dict[str, str] = {...} block")
	}
	var names []string
	for _, e := range registryEntry.FindAllSubmatch(m[1], -1) {
		names = append(names, string(e[1]))
	}
	if len(names) == 0 || len(names) != strings.Count(string(m[1]), "\":") {
		return nil, errors.New("cookbook: " + registryPath + ": RECIPES has an entry that is not `\"name\": \"summary\",` with a lower-case name")
	}
	return names, nil
}
