package jobs

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// terminate sends SIGTERM to the job's own processes in process group pgid: every member
// but the bubblewrap processes, which would die at SIGTERM and take the sandbox down with
// SIGKILL before the job could stop cleanly. (SIGKILL, after the grace, goes to the whole
// group.) With no member found it signals the group.
func terminate(pgid int) {
	ents, err := os.ReadDir("/proc")
	sent := false
	if err == nil {
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			// pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the last ')'.
			s := string(b)
			i := strings.LastIndexByte(s, ')')
			j := strings.IndexByte(s, '(')
			if i < 0 || j < 0 {
				continue
			}
			f := strings.Fields(s[i+1:])
			if len(f) < 3 || f[2] != strconv.Itoa(pgid) || s[j+1:i] == "bwrap" {
				continue
			}
			if syscall.Kill(pid, syscall.SIGTERM) == nil {
				sent = true
			}
		}
	}
	if !sent {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
	}
}
