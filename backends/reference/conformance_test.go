package reference_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/conformance/backendtest"
)

// TestConformance runs the backend contract suite on the reference engine. The tiny model
// is written once into a temp folder; each case gets a fresh engine serving it.
func TestConformance(t *testing.T) {
	dataDir := t.TempDir()
	// the engine serves loops/tiny from DataDir/models/loops-tiny
	modelDir := filepath.Join(dataDir, "models", "loops-tiny")
	require.NoError(t, tiny.Write(modelDir))
	backendtest.Run(t, func(t *testing.T) backends.Backend {
		e, err := reference.New(reference.Options{DataDir: dataDir})
		require.NoError(t, err)
		return e
	}, backendtest.Options{
		ModelName:    tiny.Name,
		ModelDir:     modelDir,
		KnownFailing: "../../conformance/backendtest/known_failing/reference.txt",
	})
}
