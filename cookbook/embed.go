// Package cookbook carries the Loops cookbook's Python package (loops_cookbook, its
// pyproject.toml and sample data) inside the loops binary, so `loops cookbook` can install and
// run the recipes with nothing but the binary and a Python interpreter. The recipes
// themselves, and the one list of them, are Python: see README.md.
package cookbook

import "embed"

// Files holds the pip-installable package: pyproject.toml, README.md, loops_cookbook/**.py and
// the sample data.
//
//go:embed pyproject.toml README.md loops_cookbook/*.py loops_cookbook/recipes/*.py loops_cookbook/data/*.jsonl
var Files embed.FS
