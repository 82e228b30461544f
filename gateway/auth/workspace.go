package auth

import "fmt"

// MaxWorkspaceNameLen is the longest workspace name.
const MaxWorkspaceNameLen = 64

// ValidateWorkspaceName checks a workspace name given with --api-key KEY=WORKSPACE: 1 to 64
// characters from A-Z, a-z, 0-9, '_' and '-', not starting with '-'. A workspace name
// becomes a folder name under the data dir, so nothing else is accepted.
func ValidateWorkspaceName(name string) error {
	bad := len(name) == 0 || len(name) > MaxWorkspaceNameLen || name[0] == '-'
	for _, c := range name {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("API key entry KEY=%s: the workspace name %q is not allowed: use 1 to %d letters, digits, '_' or '-', not starting with '-'", name, name, MaxWorkspaceNameLen)
	}
	return nil
}
