//go:build linux

package reference

import (
	"fmt"
	"os"
	"syscall"
)

// fileIdentity describes a file's version: size, modification time, and where the system
// has them, change time and inode (a file replaced by rename gets a new inode).
func fileIdentity(st os.FileInfo) string {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d|%d|%d.%d|%d", st.Size(), st.ModTime().UnixNano(), sys.Ctim.Sec, sys.Ctim.Nsec, sys.Ino)
	}
	return fmt.Sprintf("%d|%d", st.Size(), st.ModTime().UnixNano())
}
