// Package scripts carries the repository's shell helpers that the loops binary runs itself:
// pyenv.sh, the cached-venv builder (`loops cookbook` prepares its Python environment with it).
package scripts

import _ "embed"

// Pyenv is scripts/pyenv.sh: `bash -c "$Pyenv" pyenv.sh NAME REQUIREMENT...` prints the path
// of a cached venv with the requirements installed.
//
//go:embed pyenv.sh
var Pyenv string
