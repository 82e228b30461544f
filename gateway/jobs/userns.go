package jobs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// sandboxID is the uid and gid a job has inside its sandbox.
const sandboxID = 1000

// userNamespace makes the user namespace a job's sandbox runs in and returns it open, for
// `bwrap --userns FD`. The namespace belongs to a short-lived helper process (the relay
// binary, `hold`) that the gateway starts with CLONE_NEWUSER and the maps below, and ends
// once the namespace is open.
//
// Under an unprivileged gateway (root false) it maps the sandbox's uid and gid 1000 to the
// gateway's own, which is all such a process may map: bubblewrap sets the sandbox up as
// that user and the job runs as it, with no capability.
//
// Under a root gateway it maps 1000 to hostID, the job's own host uid and gid (never 0,
// never the gateway's), and 0 to 0. Bubblewrap sets the sandbox up as root of the
// namespace (with capabilities in it only), so that it can bind folders only root may
// reach (a venv or a Hugging Face cache under /root); the relay, the sandbox's first
// process, drops to 1000 before anything of the job's runs, and no_new_privs (which
// bubblewrap sets) keeps a set-uid-root file from bringing uid 0 back.
func userNamespace(relay, env []string, root bool, hostID int) (*os.File, error) {
	uid, gid := os.Getuid(), os.Getgid()
	ids := func(id int) []syscall.SysProcIDMap {
		return []syscall.SysProcIDMap{{ContainerID: sandboxID, HostID: id, Size: 1}}
	}
	attr := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: ids(uid),
		GidMappings: ids(gid),
		Pdeathsig:   syscall.SIGKILL,
	}
	if root {
		if hostID <= 0 || hostID == uid {
			return nil, fmt.Errorf("a job's host uid must be unprivileged, not %d", hostID)
		}
		root := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
		attr.UidMappings = append(root, ids(hostID)...)
		attr.GidMappings = append(root, ids(hostID)...)
		attr.GidMappingsEnableSetgroups = true
	}
	cmd := exec.Command(relay[0], append(append([]string(nil), relay[1:]...), "hold")...)
	cmd.Env = env
	cmd.SysProcAttr = attr
	hold, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = hold.Close()
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) {
			return nil, fmt.Errorf("this host does not let the gateway's user (uid %d) make a user namespace (%w): enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0; on Ubuntu 24.04+ an AppArmor profile allowing userns for bwrap), or run the gateway as root", uid, err)
		}
		return nil, fmt.Errorf("starting the user namespace's holder: %w", err)
	}
	ns, oerr := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	_ = hold.Close()
	werr := cmd.Wait()
	if oerr != nil {
		return nil, fmt.Errorf("opening the job's user namespace: %w", oerr)
	}
	if werr != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("the user namespace's holder: %w", werr)
	}
	return ns, nil
}
