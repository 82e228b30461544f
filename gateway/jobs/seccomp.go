package jobs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The system calls a job may not make (EPERM): mounting and the new mount API, changing
// root, tracing other processes or reading their memory, the kernel keyring, BPF, perf
// events, userfaultfd and io_uring (frequent exploit primitives), handles that bypass
// path permissions, loading kernels or modules, rebooting, swap, the kernel log, accounting,
// quotas, the clocks and the x86 port permissions. Entering or creating namespaces (setns,
// unshare, clone with a CLONE_NEW* flag) is refused too, so a job cannot make a user
// namespace in which it would be root; clone3, whose flags a filter cannot read, answers
// ENOSYS so that the C library falls back to clone. Nearly all of these need a capability
// the job lacks anyway: the filter is the second wall, and the one that holds against a
// kernel bug in the first.
var deniedSyscalls = []string{
	"mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
	"fsmount", "fspick", "mount_setattr",
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
	"keyctl", "add_key", "request_key",
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	"open_by_handle_at", "name_to_handle_at",
	"kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
	"swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"setns", "unshare",
	"lookup_dcookie", "uselib", "vhangup", "iopl", "ioperm",
}

// cloneNewFlags are clone's namespace flags (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC,
// NEWUSER, NEWPID, NEWNET).
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// deniedIoctls are the terminal ioctls that push input to a terminal or drive the console:
// TIOCSTI (type into a terminal) and TIOCLINUX. The sandbox has no terminal at all; the
// filter refuses them whatever the descriptor.
var deniedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX}

const retErrnoEPERM = uint32(seccomp.ActionErrno) | uint32(unix.EPERM)

// seccompFilter returns the jobs' seccomp filter as bubblewrap reads it (--seccomp FD: an
// array of struct sock_filter in the machine's byte order), for this machine's
// architecture.
//
// The filter starts with a gate written here: a system call of another architecture (the
// 32-bit x86 ABI through int 0x80 on amd64) is refused with ENOSYS, so that no deny rule
// can be bypassed by its other number; an ioctl whose request's low 32 bits (what the
// kernel reads) name a denied request is refused. Then the rest, assembled by
// github.com/elastic/go-seccomp-bpf from deniedSyscalls: each is EPERM, clone with a
// namespace flag is EPERM, clone3 is ENOSYS, everything else is allowed.
func seccompFilter() ([]byte, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("no seccomp filter for %s: %w", runtime.GOARCH, err)
	}
	prog, err := seccompInstructions(info)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	var buf bytes.Buffer
	for _, r := range raw {
		// struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }
		_ = binary.Write(&buf, binary.NativeEndian, struct {
			Op     uint16
			Jt, Jf uint8
			K      uint32
		}{r.Op, r.Jt, r.Jf, r.K})
	}
	return buf.Bytes(), nil
}

// seccompInstructions is the filter's program for the architecture info.
func seccompInstructions(info *arch.Info) ([]bpf.Instruction, error) {
	var names []string
	for _, n := range deniedSyscalls {
		if _, ok := info.SyscallNames[n]; ok { // some are x86's only
			names = append(names, n)
		}
	}
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: names},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
				Name:       "clone",
				Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNewFlags}},
			}}},
			{Action: seccomp.Action(uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)), Names: []string{"clone3"}},
		},
	}
	rest, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp policy: %w", err)
	}
	ioctl, ok := info.SyscallNames["ioctl"]
	if !ok {
		return nil, fmt.Errorf("no ioctl system call on %s", info.Name)
	}
	// seccomp_data: nr at 0, arch at 4, instruction pointer at 8, args at 16 (8 bytes each).
	argLo := uint32(16 + 8*1)
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian: the low half comes second
		argLo += 4
	}
	n := len(deniedIoctls)
	gate := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)},
		bpf.LoadAbsolute{Off: 0, Size: 4},
		// Not ioctl: on to the policy (past the request checks and the EPERM).
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(ioctl | info.SeccompMask), SkipFalse: uint8(n + 2)},
		bpf.LoadAbsolute{Off: argLo, Size: 4},
	}
	for i, req := range deniedIoctls {
		// A denied request jumps to the EPERM after the checks; the last check that fails
		// skips it.
		gate = append(gate, bpf.JumpIf{Cond: bpf.JumpEqual, Val: req, SkipTrue: uint8(n - 1 - i)})
	}
	gate[len(gate)-1] = bpf.JumpIf{Cond: bpf.JumpEqual, Val: deniedIoctls[n-1], SkipFalse: 1}
	gate = append(gate, bpf.RetConstant{Val: retErrnoEPERM})
	return append(gate, rest...), nil
}
