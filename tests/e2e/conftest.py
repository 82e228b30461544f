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
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from loops_server import running_server  # noqa: E402
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


@pytest.fixture(scope="session", autouse=True)
def loops_url() -> str:
    """Base URL of the Loops server under test; also exported as TINKER_BASE_URL."""
    global _server_log_path
    with running_server("e2e") as server:
        _server_log_path = server.log_path
        os.environ["TINKER_BASE_URL"] = server.url
        yield server.url


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
