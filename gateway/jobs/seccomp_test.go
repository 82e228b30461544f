package jobs

import (
	"encoding/binary"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data as x/net/bpf's virtual machine reads it: the VM loads
// words big-endian (network order) where the kernel loads them in the machine's order, so
// each 32-bit word is written big-endian at the offset where the machine keeps it (a 64-bit
// argument's low half first on a little-endian machine).
func seccompData(nr, auditArch uint32, args ...uint64) []byte {
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], auditArch)
	little := binary.NativeEndian.Uint16([]byte{1, 0}) == 1
	for i, v := range args {
		lo, hi := 16+8*i, 16+8*i+4
		if !little {
			lo, hi = hi, lo
		}
		binary.BigEndian.PutUint32(data[lo:], uint32(v))
		binary.BigEndian.PutUint32(data[hi:], uint32(v>>32))
	}
	return data
}

// The filter, run in x/net/bpf's virtual machine on seccomp_data as the kernel builds it:
// the denied calls are EPERM (ioctl by its request's low 32 bits, clone by its namespace
// flags), clone3 and another architecture's calls ENOSYS, the rest allowed.
// (go-seccomp-bpf assembles for the machine it runs on, so this checks that machine's
// filter.)
func TestSeccompFilter(t *testing.T) {
	const (
		allow  = uint32(seccomp.ActionAllow)
		eperm  = uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
		enosys = uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)
	)
	a, err := arch.GetInfo("")
	if err != nil {
		t.Skipf("no seccomp filter on this architecture: %v", err)
	}
	{
		prog, err := seccompInstructions(a)
		require.NoError(t, err, a.Name)
		vm, err := bpf.NewVM(prog)
		require.NoError(t, err)
		run := func(auditArch uint32, nr int, args ...uint64) uint32 {
			out, err := vm.Run(seccompData(uint32(nr), auditArch, args...))
			require.NoError(t, err)
			return uint32(out)
		}
		nr := func(name string) int {
			n, ok := a.SyscallNames[name]
			require.True(t, ok, name)
			return n
		}
		native := uint32(a.ID)
		for _, name := range []string{"mount", "umount2", "ptrace", "keyctl", "bpf", "perf_event_open", "unshare", "setns",
			"open_by_handle_at", "kexec_load", "reboot", "init_module", "io_uring_setup", "userfaultfd", "process_vm_writev", "fsopen"} {
			require.Equal(t, eperm, run(native, nr(name)), "%s %s", a.Name, name)
		}
		for _, name := range []string{"read", "write", "openat", "mmap", "futex", "execve", "wait4", "socket", "connect"} {
			require.Equal(t, allow, run(native, nr(name)), "%s %s", a.Name, name)
		}
		ioctl := nr("ioctl")
		require.Equal(t, eperm, run(native, ioctl, 0, unix.TIOCSTI), a.Name)
		require.Equal(t, eperm, run(native, ioctl, 0, 0xffffffff_00000000|unix.TIOCSTI), "%s: the kernel reads the request's low 32 bits", a.Name)
		require.Equal(t, eperm, run(native, ioctl, 1, unix.TIOCLINUX), a.Name)
		require.Equal(t, allow, run(native, ioctl, 1, unix.TCGETS), a.Name)
		require.Equal(t, allow, run(native, ioctl, 1, unix.TIOCOUTQ), a.Name)
		clone := nr("clone")
		require.Equal(t, eperm, run(native, clone, unix.CLONE_NEWUSER), a.Name)
		require.Equal(t, eperm, run(native, clone, unix.CLONE_NEWNS|uint64(unix.SIGCHLD)), a.Name)
		require.Equal(t, eperm, run(native, clone, unix.CLONE_NEWNET), a.Name)
		threads := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
		require.Equal(t, allow, run(native, clone, threads), a.Name)
		require.Equal(t, allow, run(native, clone, uint64(unix.SIGCHLD)), "%s: fork", a.Name)
		require.Equal(t, enosys, run(native, nr("clone3")), a.Name)
		// Another architecture's numbering (i386 through int 0x80 on amd64, arm on arm64).
		other := uint32(arch.I386.ID)
		if a.ID == arch.AARCH64.ID {
			other = uint32(arch.ARM.ID)
		}
		require.Equal(t, enosys, run(other, 21 /* i386 mount */), a.Name)
		require.Equal(t, enosys, run(other, 3 /* i386 read */), a.Name)
	}
	if a.ID == arch.X86_64.ID {
		// x32 numbers on amd64 (the same audit arch, bit 30 set).
		prog, err := seccompInstructions(a)
		require.NoError(t, err)
		vm, err := bpf.NewVM(prog)
		require.NoError(t, err)
		out, err := vm.Run(seccompData(uint32(a.SyscallNames["mount"])|0x40000000, uint32(a.ID)))
		require.NoError(t, err)
		require.Equal(t, enosys, uint32(out))
	}

	b, err := seccompFilter()
	require.NoError(t, err)
	require.Zero(t, len(b)%8, "an array of struct sock_filter")
}
