"""Access requests end to end, with the real tinker SDK and the loops CLI (docs/access.md).

A server whose workspace policy allows only a second model and one run at once, with an
operator webhook on a loopback receiver. The member's unmodified tinker script (two LoRA
training clients on loops/tiny, a step on each) first hits the model allowlist (403), then,
once the model is granted, the run cap (429): each time the SDK shows the server's message
unchanged, naming the limit, its value and the exact `loops access request ...` command,
and fails at once (no minutes of retries). The member runs that command, an admin grants it
(`loops access grant`), and the same script runs. A grant with --for expires and reverts by
itself. The webhook receiver gets every event signed with HMAC-SHA256; it is restarted in
the middle and loses none. Isolation: a member cannot grant; another workspace's admin
neither sees nor grants the request.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from loops_server import loops_binary, running_server

OPERATOR_KEY = "tml-e2e-access-operator"
FLAG_KEY = "tml-e2e-access-flag"
SECRET = b"e2e-access-webhook-secret-0123456789"

SCRIPT = """
import tinker
from tinker import types

service = tinker.ServiceClient()
clients = [service.create_lora_training_client(base_model="loops/tiny", rank=4) for _ in range(2)]
tokens = [5, 6, 7, 8, 9, 10, 11, 12]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 7})
for tc in clients:
    tc.forward_backward([datum], "cross_entropy").result(timeout=120)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=120)
print("TRAINED", len(clients))
"""


class Receiver:
    """A loopback webhook receiver that checks signatures, dedupes on the event id and can
    be stopped and started again on the same port."""

    def __init__(self) -> None:
        self.events: dict[str, dict] = {}
        self.bad = 0
        self.port = 0
        self.httpd: http.server.HTTPServer | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                want = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
                ok = hmac.compare_digest(want, self.headers.get("X-Loops-Signature", ""))
                with receiver.lock:
                    if not ok:
                        receiver.bad += 1
                    else:
                        ev = json.loads(body)
                        assert ev["id"] == self.headers["X-Loops-Event-Id"]
                        receiver.events[ev["id"]] = ev
                self.send_response(204 if ok else 401)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()

    def types(self) -> list[str]:
        with self.lock:
            return sorted(e["type"] for e in self.events.values())


@pytest.fixture(scope="module")
def env():
    rcv = Receiver()
    rcv.start()
    tmp = Path(tempfile.mkdtemp(prefix="loops-access-"))
    data = tmp / "data"
    second = data / "models" / "loops-tiny"  # the folder loops/tiny is written to: a second model
    policy = tmp / "policy.yaml"
    policy.write_text(f"default:\n  models: [{json.dumps(str(second))}]\n  max_concurrent_runs: 1\n")
    secret = tmp / "secret"
    secret.write_bytes(SECRET)
    args = ["--data-dir", str(data), "--model", "loops/tiny", "--model", str(second),
            "--workspace-policy", str(policy), "--api-key", f"{FLAG_KEY}=flag-ws", "--operator-key", OPERATOR_KEY,
            "--session-ttl", "15s", "--access-sweep", "1s",
            "--access-webhook-url", f"http://127.0.0.1:{rcv.port}/hook", "--access-webhook-secret-file", str(secret)]
    with running_server("access", args) as server:
        yield server.url, rcv
    rcv.stop()


def loops(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(loops_binary()), *args, "--url", url, "--api-key", key],
                          capture_output=True, text=True, timeout=60)


def ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


def create_key(url: str, key: str, *args: str) -> str:
    return ok(loops(url, key, "keys", "create", *args)).strip()


def run_script(url: str, key: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, TINKER_BASE_URL=url, TINKER_API_KEY=key)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    return p, time.monotonic() - start


def wait_no_live_runs(url: str, key: str) -> None:
    """The failed script's session ends (no heartbeat for --session-ttl) and frees its run."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ws = httpx.get(f"{url}/v1/workspace", headers={"X-API-Key": key}).json()
        if int(ws.get("use", {}).get("liveRuns", ws.get("use", {}).get("live_runs", 0)) or 0) == 0:
            return
        time.sleep(1)
    raise AssertionError(f"live runs did not end: {ws}")


def asked_command(stderr: str) -> str:
    m = re.search(r'loops access request --model (\S+)((?: --[a-z-]+ \d+)*) --reason "\.\.\."', stderr)
    assert m, stderr[-3000:]
    return m.group(0)


def request_from(url: str, key: str, command: str) -> str:
    """Runs the command the error named, with a real reason, and returns the request id."""
    args = command.split()[2:]  # drop "loops access"
    args = args[: args.index("--reason")] + ["--reason", "my experiment needs it", "--json"]
    return json.loads(ok(loops(url, key, "access", *args)))["id"]


def models_of(url: str, key: str) -> list[str]:
    caps = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": key})
    return [m["model_name"] for m in caps.json()["supported_models"]]


def test_member_asks_admin_grants_same_script_runs(env):
    url, rcv = env
    admin = create_key(url, OPERATOR_KEY, "--workspace", "team-x", "--role", "admin")
    member = create_key(url, admin, "--name", "member")
    other_admin = create_key(url, OPERATOR_KEY, "--workspace", "team-y", "--role", "admin")
    assert "loops/tiny" not in models_of(url, member)

    # 1. The model allowlist: 403, the command, at once.
    p, took = run_script(url, member)
    assert p.returncode != 0 and "TRAINED" not in p.stdout
    assert "PermissionDenied" in p.stderr or "403" in p.stderr, p.stderr[-3000:]
    assert 'may not use base model "loops/tiny"' in p.stderr
    cmd = asked_command(p.stderr)
    assert cmd == 'loops access request --model loops/tiny --reason "..."'
    assert took < 60, f"the SDK retried the 403 for {took:.0f}s"
    took_403 = took
    print(f"\nallowlist 403: the script failed after {took:.1f}s")
    req = request_from(url, member, cmd)

    # Isolation: the member cannot grant; team-y's admin neither sees nor grants it.
    denied = loops(url, member, "access", "grant", req)
    assert denied.returncode != 0 and "needs a workspace admin key" in denied.stderr
    assert req not in ok(loops(url, other_admin, "access", "list"))
    nf = loops(url, other_admin, "access", "grant", req)
    assert nf.returncode != 0 and "not found" in nf.stderr
    nf = loops(url, other_admin, "access", "list", "--workspace", "team-x")
    assert nf.returncode != 0 and "not found" in nf.stderr
    # Beyond the catalog: refused with the maximum.
    big = loops(url, admin, "access", "grant", req, "--max-seq-len", "100000000")
    assert big.returncode != 0 and "the maximum is" in big.stderr, big.stderr

    granted = json.loads(ok(loops(url, admin, "access", "grant", req, "--json", "--reason", "ok")))
    assert granted["state"] == "ACCESS_STATE_GRANTED"
    assert json.loads(granted["policy_after"])["allowed"] is True
    assert "loops/tiny" in models_of(url, member)
    ws = ok(loops(url, member, "workspace"))
    assert "loops/tiny" in ws

    # 2. The run cap: 429, the command, at once (the SDK does not back off for minutes).
    p, took = run_script(url, member)
    assert p.returncode != 0 and "TRAINED" not in p.stdout
    assert "max_concurrent_runs in its policy, now 1" in p.stderr, p.stderr[-3000:]
    cmd = asked_command(p.stderr)
    assert cmd == 'loops access request --model loops/tiny --runs 2 --reason "..."'
    print(f"run cap 429: the script failed after {took:.1f}s")
    # X-Should-Retry: false: no retries. Without it the SDK retries a 429 ten times after
    # its Retry-After (1 s), about 10 s more than the 403, which it never retries.
    assert took < took_403 + 6, f"the SDK retried the 429: {took:.1f}s against the 403's {took_403:.1f}s"
    req2 = request_from(url, member, cmd)
    ok(loops(url, admin, "access", "grant", req2))
    wait_no_live_runs(url, member)

    # 3. The same script runs.
    p, _ = run_script(url, member)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "TRAINED 2" in p.stdout

    # The member sees its own requests, granted.
    mine = json.loads(ok(loops(url, member, "access", "list", "--json")))["requests"]
    assert {r["id"] for r in mine} == {req, req2}
    assert {r["state"] for r in mine} == {"ACCESS_STATE_GRANTED"}
    audit = httpx.get(f"{url}/v1/audit/events", params={"action": "workspace_policy_change"},
                      headers={"X-API-Key": admin}).json()
    assert len(audit["events"]) == 2


def test_expiring_grant_reverts_and_webhook_loses_nothing_across_receiver_restart(env):
    url, rcv = env
    admin = create_key(url, OPERATOR_KEY, "--workspace", "team-z", "--role", "admin")
    member = create_key(url, admin, "--name", "member")
    before = len(rcv.types())

    rcv.stop()  # the receiver restarts: down while a request and its grant happen
    req = json.loads(ok(loops(url, member, "access", "request", "--model", "loops/tiny", "--reason", "short test", "--json")))["id"]
    ok(loops(url, admin, "access", "grant", req, "--for", "4s"))
    assert "loops/tiny" in models_of(url, member)
    time.sleep(2)
    failing = json.loads(ok(loops(url, admin, "access", "webhooks", "--json")))["deliveries"]
    assert any(d.get("last_error") for d in failing), failing  # failures are visible to admins
    rcv.start()

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = json.loads(ok(loops(url, member, "access", "get", req, "--json")))["state"]
        if state == "ACCESS_STATE_EXPIRED" and len(rcv.types()) >= before + 3:
            break
        time.sleep(1)
    assert state == "ACCESS_STATE_EXPIRED"
    assert "loops/tiny" not in models_of(url, member), "the grant reverted by itself"
    got = rcv.types()
    for t in ("access_request.created", "access_request.granted", "access_request.expired"):
        assert t in got, got
    assert rcv.bad == 0
    deliveries = json.loads(ok(loops(url, admin, "access", "webhooks", "--json")))["deliveries"]
    assert {d["state"] for d in deliveries} == {"delivered"}, deliveries
