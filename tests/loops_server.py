"""Starts `loops serve` for the Python suites (tests/e2e, tests/sdk_matrix, tests/cookbook).

Each suite's conftest.py wraps `running_server(label)` in a session fixture. Environment:

  LOOPS_E2E_URL         use this running server instead of starting one
  LOOPS_E2E_BIN         a prebuilt `loops` binary (default: `go build ./cmd/loops` once)
  LOOPS_E2E_SERVE_ARGS  extra arguments for `loops serve`
  LOOPS_E2E_KEEP        keep the temporary folder (binary, data, server.log)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_URL_RE = re.compile(r"http://\S+")


class Server:
    """A server under test: its base URL and, when this process started it, its log."""

    def __init__(self, url: str, log_path: Path | None) -> None:
        self.url = url
        self.log_path = log_path

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def wait_for_port(url: str, timeout: float = 30) -> None:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} did not accept connections in time")


_built: Path | None = None


def loops_binary() -> Path:
    """The `loops` binary the servers run, for tests that also run its CLI: LOOPS_E2E_BIN, or
    `go build ./cmd/loops` once per test process into a folder removed at exit."""
    global _built
    if bin_env := os.environ.get("LOOPS_E2E_BIN"):
        return Path(bin_env)
    if _built is not None and _built.exists():
        return _built
    go = shutil.which("go")
    if go is None:
        pytest.exit("go is not on PATH; set LOOPS_E2E_URL or LOOPS_E2E_BIN", returncode=2)
    out = Path(tempfile.mkdtemp(prefix="loops-bin-"))
    atexit.register(shutil.rmtree, out, True)
    binary = out / "loops"
    proc = subprocess.run([go, "build", "-o", str(binary), "./cmd/loops"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        pytest.exit(f"go build ./cmd/loops failed:\n{proc.stdout}\n{proc.stderr}", returncode=2)
    _built = binary
    return binary


def _build_binary(out: Path) -> Path:
    del out  # the binary is built once per process (loops_binary), not per server
    return loops_binary()


@contextlib.contextmanager
def running_server(label: str, extra_args: list[str] | None = None) -> Iterator[Server]:
    """Starts `loops serve --addr 127.0.0.1:0` (with extra_args) on a fresh data folder (or
    uses LOOPS_E2E_URL, unless extra_args are given), waits for the URL it prints, and stops
    it on exit. A server that does not start ends the pytest session with its log."""
    if (url := os.environ.get("LOOPS_E2E_URL")) and not extra_args:
        url = url.rstrip("/")
        wait_for_port(url)
        yield Server(url, None)
        return

    tmp = Path(tempfile.mkdtemp(prefix=f"loops-{label}-"))
    try:
        binary = _build_binary(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log_path = tmp / "server.log"
    cmd = [str(binary), "serve", "--addr", "127.0.0.1:0", "--data-dir", str(tmp / "data")]
    cmd += shlex.split(os.environ.get("LOOPS_E2E_SERVE_ARGS", ""))
    cmd += extra_args or []
    log = open(log_path, "w", buffering=1)
    log.write(f"$ {shlex.join(cmd)}\n")
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.PIPE, text=True, bufsize=1)
    found: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.write(line)
            if not ready.is_set() and (m := _URL_RE.search(line)):
                found["url"] = m.group(0).rstrip("/").rstrip(".,;")
                ready.set()
        ready.set()

    threading.Thread(target=pump, name="loops-stderr", daemon=True).start()
    server = Server("", log_path)
    if not ready.wait(120) or "url" not in found:
        code = proc.poll()
        proc.kill()
        why = (f"exited with status {code} before printing its URL" if code is not None
               else "did not print its URL within 120 s")
        tail = server.log_tail()
        log.close()
        if not os.environ.get("LOOPS_E2E_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        pytest.exit(f"loops serve {why}; log:\n{tail}", returncode=2)
    server.url = found["url"]
    wait_for_port(server.url)
    sys.stderr.write(f"\n[{label}] loops serve at {server.url} (log {log_path})\n")
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        if os.environ.get("LOOPS_E2E_KEEP"):
            sys.stderr.write(f"\n[{label}] kept {tmp}\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
