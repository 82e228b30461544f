"""The SDK's `tinker` CLI against Loops: every command of the installed release's click
group (enumerated by introspection, not listed by hand) runs once, with JSON output, and
its answer is checked. A command without a recipe in CLI_RECIPES fails as unclassified.

Commands whose route Loops does not serve yet are listed in EXPECTED_TO_FAIL, the one
place to flip once the route lands: they run as strict xfails, so a command that starts
working fails the suite ("XPASS(strict)") until its line is removed.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import tinker

from sdkm_helpers import BASE_MODEL, SDK_VERSION, new_client, result, sft_batch, train_step

cell = pytest.mark.cell

# command -> why it fails on Loops (empty: every command of the CLI works against loops serve).
EXPECTED_TO_FAIL: dict[str, str] = {}


def _uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def cli(*args: str, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """The SDK's `tinker` console script (`python -m tinker.cli` if absent), JSON output.
    Torch is hidden from it (importing torch costs seconds per CLI call; the CLI never uses it)."""
    exe = Path(sys.executable).with_name("tinker")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tinker.cli"]
    try:
        p = subprocess.run(cmd + ["--format", "json", *args], capture_output=True, text=True, input=input,
                           timeout=timeout, env={**os.environ, "LOOPS_NO_TORCH_OVERLAY": "1", **(env or {})})
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"tinker {' '.join(args)} did not finish in {timeout:.0f}s "
                             f"(stderr: {(e.stderr or b'')[-500:]!r})") from None
    if check:
        assert p.returncode == 0, f"tinker {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def cli_commands() -> list[str]:
    """Every leaf command of the installed CLI's click group, as 'group command'."""
    import click

    main = importlib.import_module("tinker.cli.__main__")
    root = next(v for v in vars(main).values() if isinstance(v, click.Group))
    out: list[str] = []

    def walk(group: Any, prefix: list[str], ctx: Any) -> None:
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if isinstance(sub, click.Group):
                walk(sub, prefix + [name], click.Context(sub, parent=ctx))
            else:
                out.append(" ".join(prefix + [name]))

    walk(root, [], click.Context(root))
    return out


class Env:
    """What the command recipes share: a session with a trained run and checkpoints."""

    def __init__(self, service_client: Any, tokenizer: Any, tmp: Path) -> None:
        self.service = service_client
        self.tokenizer = tokenizer
        self.tmp = tmp
        self._run: tuple[Any, str, str] | None = None

    @property
    def run(self) -> tuple[Any, str, str]:
        """A run trained one step, with a training and a sampler checkpoint."""
        if self._run is None:
            tc = new_client(self.service, seed=31)
            train_step(tc, sft_batch(self.tokenizer))
            state = result(tc.save_state(_uniq("state"))).path
            sampler = result(tc.save_weights_for_sampler(_uniq("sampler"))).path
            self._run = (tc, state, sampler)
        return self._run

    def fresh_checkpoint(self) -> tuple[Any, str]:
        tc = new_client(self.service, rank=4)
        return tc, result(tc.save_state(_uniq("cli"))).path

    def session_id(self) -> str:
        self.run  # noqa: B018  (the session has work in it)
        holder = self.service.holder
        if hasattr(holder, "get_session_id"):
            return holder.get_session_id()
        rest = tinker.RestClient() if hasattr(tinker, "RestClient") else self.service.create_rest_client()
        return result(rest.list_sessions(limit=1)).sessions[0]


CLI_RECIPES: dict[str, tuple[str, Callable[[Env], None]]] = {}


def recipe(command: str, cell_name: str) -> Callable[[Callable[[Env], None]], Callable[[Env], None]]:
    def deco(fn: Callable[[Env], None]) -> Callable[[Env], None]:
        CLI_RECIPES[command] = (cell_name, fn)
        return fn

    return deco


# ----------------------------------------------------------------------------- run


@recipe("run list", "cli_run")
def _run_list(env: Env) -> None:
    tc, _, _ = env.run
    listing = cli("run", "list", "--limit", "0")
    assert tc.model_id in listing.stdout, listing.stdout[:2000]


@recipe("run info", "cli_run")
def _run_info(env: Env) -> None:
    tc, _, _ = env.run
    info = json.loads(cli("run", "info", tc.model_id).stdout)
    assert json.dumps(info).count(tc.model_id) >= 1 and BASE_MODEL in json.dumps(info), info


# ----------------------------------------------------------------------------- checkpoint


@recipe("checkpoint list", "cli_checkpoint")
def _ckpt_list(env: Env) -> None:
    tc, state, sampler = env.run
    listing = cli("checkpoint", "list", "--run-id", tc.model_id).stdout
    assert state in listing and sampler in listing, listing


@recipe("checkpoint info", "cli_checkpoint")
def _ckpt_info(env: Env) -> None:
    _, state, _ = env.run
    info = json.loads(cli("checkpoint", "info", state).stdout)
    assert state in json.dumps(info), info


@recipe("checkpoint publish", "cli_checkpoint")
def _ckpt_publish(env: Env) -> None:
    _, path = env.fresh_checkpoint()
    cli("checkpoint", "publish", path)
    assert json.loads(cli("checkpoint", "info", path).stdout).get("public") is True


@recipe("checkpoint unpublish", "cli_checkpoint")
def _ckpt_unpublish(env: Env) -> None:
    _, path = env.fresh_checkpoint()
    cli("checkpoint", "publish", path)
    cli("checkpoint", "unpublish", path)
    assert json.loads(cli("checkpoint", "info", path).stdout).get("public") is False


@recipe("checkpoint set-ttl", "cli_checkpoint")
def _ckpt_ttl(env: Env) -> None:
    _, path = env.fresh_checkpoint()
    cli("checkpoint", "set-ttl", path, "--ttl", "3600")
    assert json.loads(cli("checkpoint", "info", path).stdout).get("expires_at")
    cli("checkpoint", "set-ttl", path, "--remove")
    assert not json.loads(cli("checkpoint", "info", path).stdout).get("expires_at")


@recipe("checkpoint delete", "cli_checkpoint")
def _ckpt_delete(env: Env) -> None:
    tc, path = env.fresh_checkpoint()
    p = cli("checkpoint", "delete", path, "-y", check=False)
    if p.returncode == 2 and "Got unexpected extra argument" in p.stderr:
        # tinker 0.18.x: click rejects the command's own documented syntax before any
        # request is made (the same delete through RestClient works; see rest_delete).
        pytest.skip("n/a: this release's `tinker checkpoint delete PATH -y` fails client-side "
                    "(click: 'Got unexpected extra argument'); no request reaches the server")
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert path not in cli("checkpoint", "list", "--run-id", tc.model_id).stdout


@recipe("checkpoint download", "cli_download")
def _ckpt_download(env: Env) -> None:
    _, state, _ = env.run
    out = env.tmp / "download"
    # 0.3x+ exports a training checkpoint through save_weights_external + external_weights_urls.
    cli("checkpoint", "download", state, "--output", str(out), timeout=90)
    files = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files or any(
        f.endswith(".tar") for f in files), files


@recipe("checkpoint push-hf", "cli_push_hf")
def _ckpt_push_hf(env: Env) -> None:
    # push-hf uploads to the Hugging Face Hub: it asks the Hub who the token belongs to
    # (HfApi.whoami) before it downloads anything from Loops. Pointed at a closed local
    # port, it must fail on the Hub, never on a Loops route.
    _, state, _ = env.run
    p = cli("checkpoint", "push-hf", state, "--repo", "someone/adapter", check=False, timeout=60,
            env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_not_a_token", "HF_HUB_OFFLINE": "0"})
    text = p.stdout + p.stderr
    assert p.returncode != 0, text
    assert "api/v1" not in text and "not supported by Loops" not in text, text
    assert any(w in text.lower() for w in ("hugging", "hf ", "127.0.0.1:9", "connect", "huggingface_hub")), text
    pytest.skip("n/a: `checkpoint push-hf` uploads to the Hugging Face Hub (third-party, needs its "
                "token and network); it fails on the Hub before any Loops request. Loops' part, the "
                "download, is the `checkpoint download` row")


# ----------------------------------------------------------------------------- other groups


@recipe("model list", "cli_model")
def _model_list(env: Env) -> None:
    models = json.loads(cli("model", "list").stdout)["models"]
    assert BASE_MODEL in [m["model_name"] for m in models], models
    only = json.loads(cli("model", "list", "tiny").stdout)["models"]
    assert [m["model_name"] for m in only] == [m["model_name"] for m in models if "tiny" in m["model_name"]]


@recipe("billing usage", "cli_billing")
def _billing_usage(env: Env) -> None:
    env.run  # noqa: B018  (some training to bill)
    today = date.today()
    out = json.loads(cli("billing", "usage", (today - timedelta(days=1)).isoformat(),
                         (today + timedelta(days=2)).isoformat()).stdout)
    assert isinstance(out["data"], list) and out["data"], out
    assert any(json.dumps(e).count("training") for e in out["data"]), out["data"][:3]


@recipe("billing checkpoint-storage", "cli_billing")
def _billing_storage(env: Env) -> None:
    env.run  # noqa: B018  (checkpoints to count)
    out = json.loads(cli("billing", "checkpoint-storage").stdout)
    assert out["data"] and sum(int(d.get("size_bytes") or 0) for d in out["data"]) > 0, out


@recipe("session export-trace", "cli_session")
def _session_export(env: Env) -> None:
    sid = env.session_id()
    dest = env.tmp / f"{sid}.pftrace"
    out = json.loads(cli("session", "export-trace", sid, "--output", str(dest), timeout=120).stdout)
    assert dest.exists() and dest.stat().st_size > 0, out
    url = json.loads(cli("session", "export-trace", sid, "--url-only", timeout=120).stdout)
    assert str(url.get("url", "")).startswith("http"), url


@recipe("auth status", "cli_auth")
def _auth_status(env: Env) -> None:
    p = cli("auth", "status")
    assert "Tinker accessible: yes" in p.stdout, p.stdout


@recipe("auth whoami", "cli_auth")
def _auth_whoami(env: Env) -> None:
    who = json.loads(cli("auth", "whoami").stdout)
    assert who.get("user_urn"), who


def _home(env: Env, name: str) -> dict[str, str]:
    home = env.tmp / name
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home)}


@recipe("auth login", "cli_auth")
def _auth_login(env: Env) -> None:
    # A fresh HOME: login stores the pasted key in ~/.tinker/credentials.json.
    h = _home(env, "login-home")
    p = cli("auth", "login", input=os.environ["TINKER_API_KEY"] + "\n", env=h, timeout=60)
    assert "Logged in as" in p.stdout, p.stdout
    creds = json.loads((Path(h["HOME"]) / ".tinker" / "credentials.json").read_text())
    assert os.environ["TINKER_API_KEY"] in json.dumps(creds)


@recipe("auth logout", "cli_auth")
def _auth_logout(env: Env) -> None:
    # A stored, manually pasted key: logout removes it locally and leaves the key active
    # (only keys the SDK generated are revoked on the server).
    h = _home(env, "logout-home")
    store_py = (
        "from tinker.lib.credentials import JsonCredentialStore, ManualKey, default_credentials_path\n"
        "s = JsonCredentialStore(default_credentials_path())\n"
        f"s.add_key('k1', ManualKey(key={os.environ['TINKER_API_KEY']!r}, name='surface', note='', details=None))\n"
        "s.set_default('k1')\n")
    subprocess.run([sys.executable, "-c", store_py], check=True, env={**os.environ, **h,
                                                                       "LOOPS_NO_TORCH_OVERLAY": "1"})
    p = cli("auth", "logout", env=h)
    assert "Removed credential 'surface'" in p.stdout, p.stdout
    assert cli("auth", "logout", env=h, check=False).returncode != 0, "a second logout found a credential"
    cli("run", "list", "--limit", "1")  # the key still works


@recipe("version", "cli_version")
def _version(env: Env) -> None:
    assert tinker.__version__ in cli("version").stdout


# ----------------------------------------------------------------------------- the test


def _params() -> list[Any]:
    out = []
    for command in cli_commands():
        cell_name, _ = CLI_RECIPES.get(command, ("cli_unclassified", None))
        marks = [cell(cell_name)]
        if command in EXPECTED_TO_FAIL:
            marks.append(pytest.mark.xfail(reason=EXPECTED_TO_FAIL[command], strict=True))
        out.append(pytest.param(command, marks=marks, id=command.replace(" ", "_")))
    return out


@pytest.fixture(scope="module")
def cli_env(service_client, tokenizer, tmp_path_factory):
    return Env(service_client, tokenizer, tmp_path_factory.mktemp("cli"))


@pytest.mark.parametrize("command", _params())
def test_cli_command(command: str, cli_env: Env) -> None:
    if command not in CLI_RECIPES:
        pytest.fail(f"`tinker {command}` (tinker {tinker.__version__}) has no recipe in "
                    "tests/sdk_matrix/test_cli.py: classify it", pytrace=False)
    CLI_RECIPES[command][1](cli_env)


def test_recipes_name_real_commands() -> None:
    """A recipe for a command no tested release has is a typo (newest release only)."""
    if SDK_VERSION < (0, 38, 0):
        pytest.skip("older releases lack newer commands")
    assert set(CLI_RECIPES) - set(cli_commands()) == set()
