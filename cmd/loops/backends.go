package main

// The built-in backends, linked by blank import; each registers itself by name.
import (
	_ "github.com/loops-dev/loops/backends/reference"
	_ "github.com/loops-dev/loops/backends/worker"
)
