"""End-to-end tests: the unmodified tinker SDK (0.38.0) against a running Loops server.

Session fixture `loops_url`:
  * if LOOPS_E2E_URL is set, targets that server as is;
  * otherwise builds the binary (`go build -o $TMP/loops ./cmd/loops`), starts
    `loops serve --addr 127.0.0.1:0 --data-dir $TMP/data`, reads the
    `http://HOST:PORT` it prints on stderr, and stops it at the end.

The SDK is configured only through its documented environment variables
(TINKER_BASE_URL, TINKER_API_KEY, TINKER_TELEMETRY), plus HF_HUB_OFFLINE=1 so that
`get_tokenizer()` must work from the files the server wrote (no network).

Useful knobs:
  LOOPS_E2E_URL        use an already-running server
  LOOPS_E2E_BIN        use this loops binary instead of building one
  LOOPS_E2E_API_KEY    API key to send (default tml-e2e-test)
  LOOPS_E2E_TIMEOUT    seconds to wait for any one SDK future (default 180)
  LOOPS_E2E_KEEP       keep the temp dir (server log, data dir) after the run
  LOOPS_E2E_SERVE_ARGS extra arguments appended to `loops serve`
"""

from __future__ import annotations

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
from urllib.parse import urlparse

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_MODEL = "loops/tiny"
API_KEY = os.environ.get("LOOPS_E2E_API_KEY", "tml-e2e-test")

# The SDK and huggingface_hub read these when first used / imported, so set them
# before any test module imports tinker or transformers.
os.environ["TINKER_API_KEY"] = API_KEY
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["TINKER_TELEMETRY"] = "0"
for _var in ("TINKER_CREDENTIAL_CMD", "TINKER_PROJECT_ID", "TINKER_TAGS"):
    os.environ.pop(_var, None)

_URL_RE = re.compile(r"http://\S+")

# Set by the session fixture, read by the failure-report hook below.
_server_log_path: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs_torch: needs torch on the client (forward_backward_custom)"
    )
    config.addinivalue_line(
        "markers",
        "feature(name): depends on the named server feature; deselect with "
        "-m 'not feature' or LOOPS_E2E_SKIP_FEATURES=name,name",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = {f.strip() for f in os.environ.get("LOOPS_E2E_SKIP_FEATURES", "").split(",") if f.strip()}
    for item in items:
        for mark in item.iter_markers("feature"):
            name = mark.args[0] if mark.args else ""
            if name in skip or "all" in skip:
                item.add_marker(pytest.mark.skip(reason=f"feature {name!r} skipped by LOOPS_E2E_SKIP_FEATURES"))
        if item.get_closest_marker("needs_torch"):
            try:
                import torch  # noqa: F401
            except ImportError:
                item.add_marker(pytest.mark.skip(reason="torch is not installed in this venv"))


def _log_tail(path: Path | None, lines: int = 80) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and _server_log_path is not None:
        report.sections.append(("loops server log (tail)", _log_tail(_server_log_path)))


def _wait_for_port(url: str, deadline: float) -> None:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    while time.time() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} did not accept connections in time")


def _build_binary(out: Path) -> Path:
    if bin_env := os.environ.get("LOOPS_E2E_BIN"):
        return Path(bin_env)
    go = shutil.which("go")
    if go is None:
        pytest.exit("go is not on PATH; set LOOPS_E2E_URL or LOOPS_E2E_BIN", returncode=2)
    if not (REPO_ROOT / "cmd" / "loops").is_dir():
        pytest.exit(
            f"{REPO_ROOT}/cmd/loops does not exist yet; set LOOPS_E2E_URL to target a server",
            returncode=2,
        )
    binary = out / "loops"
    proc = subprocess.run(
        [go, "build", "-o", str(binary), "./cmd/loops"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        pytest.exit(f"go build ./cmd/loops failed:\n{proc.stdout}\n{proc.stderr}", returncode=2)
    return binary


@pytest.fixture(scope="session", autouse=True)
def loops_url() -> str:
    """Base URL of the Loops server under test; also exported as TINKER_BASE_URL."""
    global _server_log_path

    if url := os.environ.get("LOOPS_E2E_URL"):
        url = url.rstrip("/")
        _wait_for_port(url, time.time() + 30)
        os.environ["TINKER_BASE_URL"] = url
        yield url
        return

    tmp = Path(tempfile.mkdtemp(prefix="loops-e2e-"))
    try:
        binary = _build_binary(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    data_dir = tmp / "data"
    log_path = tmp / "server.log"
    _server_log_path = log_path
    cmd = [str(binary), "serve", "--addr", "127.0.0.1:0", "--data-dir", str(data_dir)]
    cmd += shlex.split(os.environ.get("LOOPS_E2E_SERVE_ARGS", ""))
    log = open(log_path, "w", buffering=1)
    log.write(f"$ {shlex.join(cmd)}\n")
    proc = subprocess.Popen(
        cmd,
        cwd=tmp,
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )

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
    if not ready.wait(120) or "url" not in found:
        code = proc.poll()
        proc.kill()
        why = (
            f"exited with status {code} before printing its URL"
            if code is not None
            else "did not print its URL within 120 s"
        )
        tail = _log_tail(log_path)
        log.close()
        if not os.environ.get("LOOPS_E2E_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        pytest.exit(f"loops serve {why}; log:\n" + tail, returncode=2)
    url = found["url"]
    _wait_for_port(url, time.time() + 30)
    os.environ["TINKER_BASE_URL"] = url
    sys.stderr.write(f"\n[e2e] loops serve at {url} (log {log_path})\n")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        if os.environ.get("LOOPS_E2E_KEEP"):
            sys.stderr.write(f"\n[e2e] kept {tmp}\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- clients


@pytest.fixture(scope="session")
def service_client(loops_url: str):
    import tinker

    sc = tinker.ServiceClient()
    yield sc


@pytest.fixture(scope="session")
def rest_client(loops_url: str):
    import tinker

    return tinker.RestClient()


@pytest.fixture()
def training_client(service_client):
    """A fresh LoRA training client on the tiny model (rank 8, fixed seed)."""
    from e2e_helpers import RESULT_TIMEOUT

    return service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=1234
    ).result(timeout=RESULT_TIMEOUT)


@pytest.fixture(scope="session")
def tokenizer(service_client):
    """The model's tokenizer as a user gets it: TrainingClient.get_tokenizer().

    If that fails (test_tokenizer reports why), fall back to raw UTF-8 bytes as token
    ids so that the training and sampling tests still exercise the server.
    """
    from e2e_helpers import RESULT_TIMEOUT, ByteFallbackTokenizer

    tc = service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(
        timeout=RESULT_TIMEOUT
    )
    try:
        return tc.get_tokenizer()
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"\n[e2e] get_tokenizer() failed ({exc!r}); using byte fallback\n")
        return ByteFallbackTokenizer()
