"""A sandbox for code the policy writes: no network, a time limit, a memory limit, a throwaway folder.

Preferred: bubblewrap (`bwrap`, Debian package bubblewrap). Each command runs in new user,
network, PID, IPC and UTS namespaces with the system folders read-only, an empty /tmp, no
home folder, a cleared environment, and the episode's throwaway folder as its only writable
place (/sandbox, also the working folder). Limits: wall-clock time (the process group is
killed), address space, CPU seconds, file size and open files (setrlimit, inherited).

Fallback, when bwrap is missing or cannot create namespaces (some containers): `unshare -rn`
(a user + network namespace: still no network) if that works, else a plain subprocess. Both
keep the rlimits, the time limit, the cleared environment and the throwaway working folder,
but the filesystem is NOT isolated: the code can read (and, without unshare, write) whatever
the user can. `Sandbox.mode` says which one is in use and `Sandbox.warning` is printed once.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc")


@dataclasses.dataclass
class Result:
    """What a sandboxed command did."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class Sandbox:
    """Runs commands in one throwaway folder (one episode). Use as a context manager, or call
    close(): the folder is deleted."""

    def __init__(self, time_limit: float = 5.0, memory_mb: int = 512, output_limit: int = 4000,
                 mode: str | None = None) -> None:
        self.time_limit = time_limit
        self.memory_mb = memory_mb
        self.output_limit = output_limit
        self.dir = Path(tempfile.mkdtemp(prefix="loops-sandbox-"))
        self.mode = mode or detect_mode()
        self.python = _interpreter()

    @property
    def warning(self) -> str | None:
        if self.mode == "bwrap":
            return None
        return (f"sandbox: WEAK fallback ({self.mode}): bubblewrap is unavailable, so commands run with time/memory "
                "limits and no network" + (" " if self.mode == "unshare" else " NOT blocked ") +
                "but WITHOUT filesystem isolation; install bubblewrap (apt-get install bubblewrap)")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name: str, content: str) -> None:
        """Writes a file into the sandbox folder (name relative to it)."""
        p = (self.dir / name).resolve()
        if not str(p).startswith(str(self.dir.resolve()) + os.sep):
            raise ValueError(f"{name!r} is outside the sandbox folder")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)

    def read(self, name: str) -> str | None:
        """A file of the sandbox folder, or None when it does not exist or is outside it."""
        p = (self.dir / name).resolve()
        if not str(p).startswith(str(self.dir.resolve()) + os.sep) or not p.is_file():
            return None
        return p.read_text(errors="replace")

    def run_python(self, code: str, stdin: str | None = None) -> Result:
        return self.run([self.python, "-I", "-c", code], stdin)

    def run_shell(self, script: str, stdin: str | None = None) -> Result:
        return self.run(["/bin/sh", "-c", script], stdin)

    def run(self, argv: list[str], stdin: str | None = None) -> Result:
        """Runs argv inside the sandbox; its working folder is the throwaway folder."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        if self.mode == "bwrap":
            cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
            for d in _SYSTEM_DIRS + (sys.base_prefix,):
                if os.path.exists(d):
                    cmd += ["--ro-bind", d, d]
            cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(self.dir), "/sandbox",
                    "--chdir", "/sandbox"]
            for k, v in env.items():
                cmd += ["--setenv", k, v]
            cmd += ["--"] + argv
            cwd = None
        else:
            env["HOME"] = str(self.dir)
            cmd = (["unshare", "-rn", "--"] if self.mode == "unshare" else []) + argv
            cwd = str(self.dir)
        limits = _limits(self.memory_mb, self.time_limit)
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env if self.mode != "bwrap" else {"PATH": env["PATH"]},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=limits)
        except OSError as e:
            return Result(127, "", f"cannot start: {e}", False)
        timed_out = False
        try:
            out, err = proc.communicate(stdin.encode() if stdin else None, timeout=self.time_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        cut = self.output_limit
        return Result(proc.returncode, out[:cut].decode(errors="replace"), err[:cut].decode(errors="replace"), timed_out)


def _limits(memory_mb: int, time_limit: float):
    def apply() -> None:
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(time_limit) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    return apply


def _interpreter() -> str:
    """A Python interpreter usable inside the sandbox (the base interpreter, not the venv's)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(base) if base.exists() else sys.executable


_MODE: str | None = None


def detect_mode() -> str:
    """bwrap when it works here, else unshare when that works, else plain (cached)."""
    global _MODE
    if _MODE is None:
        forced = os.environ.get("LOOPS_SANDBOX")
        if forced in ("bwrap", "unshare", "plain"):
            _MODE = forced
        elif shutil.which("bwrap") and _works(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"]):
            _MODE = "bwrap"
        elif shutil.which("unshare") and _works(["unshare", "-rn", "--", "/bin/true"]):
            _MODE = "unshare"
        else:
            _MODE = "plain"
    return _MODE


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def self_test(time_limit: float = 2.0, memory_mb: int = 256) -> tuple[bool, str]:
    """Checks that code runs, writes only its folder, has no network, and is stopped by the time
    and memory limits. Returns (ok, detail); a weak fallback passes but says so."""
    with Sandbox(time_limit=time_limit, memory_mb=memory_mb) as sb:
        problems = []
        r = sb.run_python("open('probe.txt','w').write('ok'); print(6*7)")
        if not (r.ok and r.stdout.strip() == "42" and sb.read("probe.txt") == "ok"):
            problems.append(f"python did not run ({r.returncode}: {r.stderr.strip()[:200]})")
        r = sb.run_python("import socket\ns=socket.socket(); s.settimeout(1)\ntry:\n s.connect(('1.1.1.1',53)); print('net')\n"
                          "except OSError: print('nonet')")
        if "nonet" not in r.stdout:
            problems.append("network is reachable" if "net" in r.stdout else f"network probe failed ({r.stderr.strip()[:200]})")
        r = sb.run_python("while True: pass")
        if not r.timed_out and r.returncode == 0:
            problems.append("time limit did not stop a busy loop")
        r = sb.run_python(f"b = bytearray({memory_mb * 2} * 1024 * 1024); print('allocated')")
        if "allocated" in r.stdout:
            problems.append("memory limit did not stop an allocation over it")
        if sb.mode == "bwrap":
            r = sb.run_shell(f"ls {Path.home()} 2>&1; touch /usr/probe 2>&1 || echo readonly")
            if "readonly" not in r.stdout:
                problems.append("/usr is writable")
        if problems:
            return False, f"{sb.mode}: " + "; ".join(problems)
        detail = f"{sb.mode}: code runs; no network; {time_limit:g}s and {memory_mb} MiB limits hold"
        if sb.warning:
            detail += " (WEAK fallback: no filesystem isolation)"
        return True, detail
