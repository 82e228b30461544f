package main

// The built-in backends, linked by blank import; each registers itself by name.
import (
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/worker"
)

// workerBackend is the name of the backend whose workers take workerStoreOptions.
const workerBackend = worker.Name
