package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProjectsCommands drives loops projects create|list|delete against loops serve: the
// default project is listed, a taken or bad name is refused with the server's reason, and
// another key's workspace does not see the project.
func TestProjectsCommands(t *testing.T) {
	url, _ := startServe(t, t.TempDir())
	a := []string{"--url", url, "--api-key", "tml-projects-a"}
	b := []string{"--url", url, "--api-key", "tml-projects-b"}

	out, err := runCLI(t, append([]string{"projects", "create", "vision", "--description", "image runs"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "vision")
	require.Contains(t, out, "image runs")
	out, err = runCLI(t, append([]string{"projects", "list"}, a...)...)
	require.NoError(t, err, out)
	require.Regexp(t, `(?m)^default `, out)
	require.Regexp(t, `(?m)^vision `, out)

	_, err = runCLI(t, append([]string{"projects", "create", "vision"}, a...)...)
	require.ErrorContains(t, err, "already exists")
	_, err = runCLI(t, append([]string{"projects", "create", "no/slash"}, a...)...)
	require.ErrorContains(t, err, "not valid")

	out, err = runCLI(t, append([]string{"projects", "list"}, b...)...)
	require.NoError(t, err, out)
	require.NotContains(t, out, "vision")

	_, err = runCLI(t, append([]string{"runs", "--project", "nowhere"}, a...)...)
	require.ErrorContains(t, err, "not found")
	_, err = runCLI(t, append([]string{"runs", "--project", "vision"}, a...)...)
	require.NoError(t, err)

	out, err = runCLI(t, append([]string{"projects", "delete", "vision"}, a...)...)
	require.NoError(t, err, out)
	_, err = runCLI(t, append([]string{"projects", "delete", "default"}, a...)...)
	require.ErrorContains(t, err, "cannot be deleted")
}
