//go:build !linux

package reference

import (
	"fmt"
	"os"
)

// fileIdentity describes a file's version by size and modification time.
func fileIdentity(st os.FileInfo) string {
	return fmt.Sprintf("%d|%d", st.Size(), st.ModTime().UnixNano())
}
