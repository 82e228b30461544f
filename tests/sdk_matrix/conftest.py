"""SDK matrix: one pytest session per tinker release, each in its own venv.

Starts its own `loops serve` (a fresh data dir) unless LOOPS_E2E_URL is set, like
tests/e2e/conftest.py, and records each test's outcome under its matrix cell
(`@pytest.mark.cell("name")`) into $LOOPS_SDK_RESULTS/<version>.json, which
tests/sdk_matrix/matrix.py turns into MATRIX.md.

Knobs (same names as the e2e suite): LOOPS_E2E_URL, LOOPS_E2E_BIN, LOOPS_E2E_KEEP,
LOOPS_E2E_SERVE_ARGS, LOOPS_E2E_TIMEOUT; LOOPS_SDK_RESULTS (folder for the JSON result).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from loops_server import running_server  # noqa: E402
API_KEY = "tml-sdk-matrix"

os.environ["TINKER_API_KEY"] = API_KEY
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["TINKER_TELEMETRY"] = "0"
for _var in ("TINKER_CREDENTIAL_CMD", "TINKER_PROJECT_ID", "TINKER_TAGS"):
    os.environ.pop(_var, None)

_server_log: Path | None = None
_records: list[dict] = []
_t0 = time.time()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell(name): the SDK-matrix column this test belongs to")


def _short(text: str, n: int = 220) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when == "call" and _server_log is not None and _server_log.exists():
        tail = "\n".join(_server_log.read_text(errors="replace").splitlines()[-60:])
        rep.sections.append(("loops server log (tail)", tail))
    mark = item.get_closest_marker("cell")
    if mark is None:
        return
    if rep.when == "call" or rep.failed or rep.skipped:
        if rep.skipped and hasattr(rep, "wasxfail"):
            # test_cli.py's EXPECTED_TO_FAIL: a route Loops does not serve yet.
            reason, status = rep.wasxfail, "xfail"
        elif rep.skipped:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            reason = reason.removeprefix("Skipped: ")
            status = "n/a"
        elif rep.failed:
            crash = getattr(rep.longrepr, "reprcrash", None)
            if crash is not None:
                where = str(crash.path).split("site-packages/")[-1].split("tests/sdk_matrix/")[-1]
                reason = f"{crash.message.splitlines()[0] if crash.message else ''} (at {where}:{crash.lineno})"
            else:
                reason = str(rep.longrepr)
            status = "fail"
        else:
            reason, status = "", "pass"
        _records.append(
            {"cell": mark.args[0], "test": item.name, "status": status,
             "reason": _short(reason), "seconds": round(rep.duration, 2)}
        )


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    out = os.environ.get("LOOPS_SDK_RESULTS")
    if not out:
        return
    try:
        import tinker

        version = tinker.__version__
    except Exception:  # noqa: BLE001
        version = "unknown"
    try:
        import torch

        torch_version = torch.__version__
    except Exception:  # noqa: BLE001
        torch_version = None
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"{version}.json").write_text(json.dumps(
        {"version": version, "torch": torch_version, "wall_s": round(time.time() - _t0, 1),
         "records": _records}, indent=1))


@pytest.fixture(scope="session", autouse=True)
def loops_url():
    global _server_log
    with running_server("sdk-matrix") as server:
        _server_log = server.log_path
        os.environ["TINKER_BASE_URL"] = server.url
        yield server.url


@pytest.fixture(scope="session")
def service_client(loops_url):
    import tinker

    return tinker.ServiceClient()


@pytest.fixture(scope="session")
def rest_client(service_client):
    import tinker

    if hasattr(tinker, "RestClient"):  # 0.3x+: a session-less client, the documented way
        return tinker.RestClient()
    return service_client.create_rest_client()


@pytest.fixture(scope="session")
def tokenizer(service_client):
    from sdkm_helpers import BASE_MODEL, result

    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    return tc.get_tokenizer()
