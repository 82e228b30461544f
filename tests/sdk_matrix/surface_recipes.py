"""How to call each element of the tinker surface (surface_enum.py) with valid arguments,
and what its answer must look like. Written by hand: the *list* of what to call comes from
introspection; a surface item with no recipe here fails the surface test as unclassified.

A recipe is `fn(ctx, call) -> str`: `call(obj, name, *args, **kw)` invokes the sync or the
async form of the method (whichever the item is) and resolves futures with a bound; the
recipe checks the answer for sanity (raising AssertionError when it is wrong) and returns a
short note for SURFACE.md. `CLIENT_SIDE` marks recipes that never reach the server.
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import io
import json
import tarfile
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any, Callable

import numpy as np
import tinker
from tinker import types

from sdkm_helpers import BASE_MODEL, RESULT_TIMEOUT, encode, loss_sum, result, sft_batch, sft_datum
from surface_enum import client_class

Recipe = Callable[["Ctx", "Caller"], str]
RECIPES: dict[str, Recipe] = {}
CLIENT_SIDE: set[str] = set()


class NotApplicable(Exception):
    """The client lacks something the call needs (e.g. torch); no request was made."""


def recipe(*keys: str, client_side: bool = False) -> Callable[[Recipe], Recipe]:
    def deco(fn: Recipe) -> Recipe:
        for k in keys:
            assert k not in RECIPES, f"two recipes for {k}"
            RECIPES[k] = fn
            if client_side:
                CLIENT_SIDE.add(k)
        return fn

    return deco


def _uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Caller:
    """Calls `name` (sync) or `name_async` on an object and waits for the answer."""

    def __init__(self, is_async: bool, method: str = "", timeout: float = RESULT_TIMEOUT) -> None:
        self.is_async = is_async
        self.method = method  # the item's method name (without _async), for shared recipes
        self.timeout = timeout

    def __call__(self, obj: Any, name: str, *args: Any, **kw: Any) -> Any:
        if not self.is_async:
            return result(getattr(obj, name)(*args, **kw), self.timeout)
        fn = getattr(obj, name + "_async")

        async def go() -> Any:
            r = fn(*args, **kw)
            if inspect.isawaitable(r):
                r = await r
            if hasattr(r, "result_async"):
                r = await r.result_async(timeout=self.timeout)
            return r

        return asyncio.run(asyncio.wait_for(go(), self.timeout + 5))


class Ctx:
    """Shared, lazily made resources: one session, one trained run, its checkpoints."""

    @cached_property
    def service(self) -> Any:
        return tinker.ServiceClient()

    @cached_property
    def rest(self) -> Any:
        if hasattr(tinker, "RestClient"):
            return tinker.RestClient()
        return self.service.create_rest_client()

    @cached_property
    def admin(self) -> Any:
        return tinker.AdminClient()

    def new_tc(self, seed: int = 1, **kw: Any) -> Any:
        return result(self.service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=seed, **kw))

    @cached_property
    def tc(self) -> Any:
        tc = self.new_tc(seed=7)
        result(tc.forward_backward(self.batch, "cross_entropy"))
        result(tc.optim_step(types.AdamParams(learning_rate=2e-3)))
        return tc

    @cached_property
    def tokenizer(self) -> Any:
        return self.new_tc(seed=1).get_tokenizer()

    @cached_property
    def batch(self) -> list[Any]:
        return sft_batch(self.tokenizer)[:2]

    @cached_property
    def saved(self) -> tuple[str, list[np.ndarray]]:
        """A training checkpoint of tc and tc's logprobs on the batch at that point."""
        path = result(self.tc.save_state(_uniq("state"))).path
        return path, self.logprobs(self.tc)

    @property
    def state_path(self) -> str:
        return self.saved[0]

    @cached_property
    def sampler_path(self) -> str:
        return result(self.tc.save_weights_for_sampler(_uniq("sampler"))).path

    @cached_property
    def sc(self) -> Any:
        return result(self.service.create_sampling_client(model_path=self.sampler_path))

    @cached_property
    def prompt(self) -> Any:
        return types.ModelInput.from_ints(encode(self.tokenizer, "The quick brown"))

    @cached_property
    def session_id(self) -> str:
        holder = self.service.holder
        if hasattr(holder, "get_session_id"):
            return holder.get_session_id()
        self.tc  # noqa: B018  (the session has a run)
        return result(self.rest.list_sessions(limit=1)).sessions[0]

    def logprobs(self, tc: Any, batch: list[Any] | None = None) -> list[np.ndarray]:
        out = result(tc.forward(batch or self.batch, "cross_entropy"))
        return [np.asarray(o["logprobs"].to_numpy(), dtype=np.float64) for o in out.loss_fn_outputs]

    def checkpoint(self, run_id: str, path: str) -> Any | None:
        for c in result(self.rest.list_checkpoints(run_id)).checkpoints:
            if c.tinker_path == path:
                return c
        return None

    @cached_property
    def sampler_id(self) -> str:
        sc = self.sc
        if hasattr(sc, "get_sampler_handle"):
            handle = sc.get_sampler_handle()
        else:
            handle = None
        sid = getattr(sc, "_sampling_session_id", None)
        assert sid or handle, "cannot find the sampling session id"
        return sid or handle


def check_sample(resp: Any, n: int, max_tokens: int) -> None:
    assert len(resp.sequences) == n, resp
    for s in resp.sequences:
        assert s.stop_reason in ("stop", "length"), s.stop_reason
        assert 1 <= len(s.tokens) <= max_tokens, s.tokens
        assert s.logprobs is not None and len(s.logprobs) == len(s.tokens)
        assert all(np.isfinite(s.logprobs)) and max(s.logprobs) <= 1e-6, s.logprobs


def same_logprobs(a: list[np.ndarray], b: list[np.ndarray], atol: float = 1e-5) -> bool:
    return all(np.allclose(x, y, atol=atol) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- client-side


def _client_of(ctx: Ctx, group: str) -> Any:
    return {"ServiceClient": lambda: ctx.service, "TrainingClient": lambda: ctx.tc,
            "SamplingClient": lambda: ctx.sc, "RestClient": lambda: ctx.rest,
            "AdminClient": lambda: ctx.admin}[group]()


def _telemetry(group: str) -> Recipe:
    def run(ctx: Ctx, call: Caller) -> str:
        # TINKER_TELEMETRY=0 in this suite: the SDK keeps telemetry off (None).
        t = _client_of(ctx, group).get_telemetry()
        assert t is None or hasattr(t, "log"), t
        return f"client-side; {'None with TINKER_TELEMETRY=0' if t is None else type(t).__name__}"

    return run


def _console_url(group: str) -> Recipe:
    def run(ctx: Ctx, call: Caller) -> str:
        url = _client_of(ctx, group).get_console_url()
        assert isinstance(url, str) and url.startswith("https://"), url
        return (f"client-side: the SDK builds a link into Thinking Machines' hosted console "
                f"({url[:60]}…); Loops' own console is at the server's /")

    return run


for _g in ("ServiceClient", "TrainingClient", "SamplingClient", "RestClient", "AdminClient"):
    recipe(f"{_g}.get_telemetry", client_side=True)(_telemetry(_g))
for _g in ("ServiceClient", "TrainingClient"):
    recipe(f"{_g}.get_console_url", client_side=True)(_console_url(_g))


@recipe("TrainingClient.get_tokenizer", "SamplingClient.get_tokenizer")
def _get_tokenizer(ctx: Ctx, call: Caller) -> str:
    for tok in (ctx.tc.get_tokenizer(), ctx.sc.get_tokenizer()):
        ids = encode(tok, "hello world")
        assert ids and tok.decode(ids).strip() == "hello world", ids
    return "tokenizer named by get_info / the sampler's base model; encode/decode round trip"


@recipe("SamplingClient.on_queue_state_change", client_side=True)
def _on_queue_state_change(ctx: Ctx, call: Caller) -> str:
    from tinker.lib.api_future_impl import QueueState

    ctx.sc.on_queue_state_change(QueueState.ACTIVE, None)
    return "client-side callback the SDK calls while polling queue state"


# ----------------------------------------------------------------------------- ServiceClient


@recipe("ServiceClient.get_server_capabilities")
def _capabilities(ctx: Ctx, call: Caller) -> str:
    obj = ctx.rest if isinstance(call, _RestMark) else ctx.service
    caps = call(obj, "get_server_capabilities")
    names = [m.model_name for m in caps.supported_models]
    assert BASE_MODEL in names, names
    return f"{len(names)} models"


class _RestMark(Caller):
    """A Caller that tells a shared recipe to use the RestClient form."""


@recipe("ServiceClient.create_lora_training_client")
def _create_lora(ctx: Ctx, call: Caller) -> str:
    tc = call(ctx.service, "create_lora_training_client", base_model=BASE_MODEL, rank=4, seed=3)
    info = tc.get_info()
    assert info.model_data.model_name == BASE_MODEL, info
    assert info.lora_rank in (None, 4), info
    return "get_info names the base model"


@recipe("ServiceClient.create_rest_client")
def _create_rest(ctx: Ctx, call: Caller) -> str:
    rc = ctx.service.create_rest_client()
    page = result(rc.list_training_runs(limit=1))
    assert page.cursor.total_count >= 1
    return "lists runs"


@recipe("ServiceClient.create_sampling_client")
def _svc_create_sampling(ctx: Ctx, call: Caller) -> str:
    sc = call(ctx.service, "create_sampling_client", model_path=ctx.sampler_path)
    check_sample(result(sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=4, seed=1))), 1, 4)
    base = call(ctx.service, "create_sampling_client", base_model=BASE_MODEL)
    check_sample(result(base.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=4, seed=1))), 1, 4)
    return "from a sampler path and from the base model; both sample"


@recipe("ServiceClient.create_training_client_from_state")
def _from_state(ctx: Ctx, call: Caller) -> str:
    path, want = ctx.saved
    tc = call(ctx.service, "create_training_client_from_state", path)
    assert tc.model_id != ctx.tc.model_id
    assert same_logprobs(want, ctx.logprobs(tc)), "weights differ from the checkpoint"
    return "new run with the checkpoint's weights (logprobs equal)"


@recipe("ServiceClient.create_training_client_from_state_with_optimizer")
def _from_state_opt(ctx: Ctx, call: Caller) -> str:
    path, want = ctx.saved
    tc = call(ctx.service, "create_training_client_from_state_with_optimizer", path)
    assert same_logprobs(want, ctx.logprobs(tc)), "weights differ from the checkpoint"
    return "new run with the checkpoint's weights and optimizer state"


@recipe("ServiceClient.close")
def _close(ctx: Ctx, call: Caller) -> str:
    svc = tinker.ServiceClient()
    sid = svc.holder.get_session_id() if hasattr(svc.holder, "get_session_id") else None
    r = svc.close("success", "surface matrix")
    result(r)
    return f"session {sid} finished"


@recipe("ServiceClient.copy_weights")
def _copy_weights(ctx: Ctx, call: Caller) -> str:
    # The copy lands in a project: the ServiceClient's own, or RestClient's destination.
    if isinstance(call, _RestMark):
        new = call(ctx.rest, "copy_weights", ctx.state_path, "default")
    else:
        new = call(tinker.ServiceClient(project_id="default"), "copy_weights", ctx.state_path)
    assert isinstance(new, str) and new.startswith("tinker://") and new != ctx.state_path, new
    info = result(ctx.rest.get_weights_info_by_tinker_path(new))
    assert info.base_model == BASE_MODEL and info.lora_rank == 8, info
    return f"copy into project 'default' at {new}"


def _neg_ll(logprobs: Any, weights: Any) -> Any:
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


def _neg_ll_twice(logprobs: Any, weights: Any) -> Any:
    loss = -2.0 * (logprobs * weights).sum()
    return loss, {"custom/neg_ll_twice:sum": loss}


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise NotApplicable("torch is not installed in this venv (LOOPS_SDK_TORCH=0 or no torch venv)") from None
    return torch


def _run_custom(ctx: Ctx, handle: Any, metric: str, factor: float) -> str:
    a, b = ctx.new_tc(seed=9), ctx.new_tc(seed=9)
    out = result(a.forward_backward_custom(ctx.batch, handle))
    ce = result(b.forward_backward(ctx.batch, "cross_entropy"))
    got = out.metrics.get(metric)
    assert got is not None and np.isclose(got, factor * loss_sum(ce), rtol=1e-4), (out.metrics, ce.metrics)
    where = "server-side" if getattr(handle, "loss_id", None) else "client-side (the SDK fell back: no upload)"
    return f"{metric} == {factor:g} x cross_entropy loss:sum; runs {where}"


@recipe("ServiceClient.create_custom_loss")
def _create_custom_loss(ctx: Ctx, call: Caller) -> str:
    _torch()
    handle = call(ctx.service, "create_custom_loss", _neg_ll, {"logprobs": 1, "weights": 1})
    return _run_custom(ctx, handle, "custom/neg_ll:sum", 1.0)


@recipe("loss:custom")
def _loss_custom(ctx: Ctx, call: Caller) -> str:
    # loss_fn "custom" is what forward_backward_custom sends with a LossHandle (another
    # traced loss than create_custom_loss's: a session creates each loss once).
    _torch()
    handle = result(ctx.service.create_custom_loss(_neg_ll_twice, {"logprobs": 1, "weights": 1}))
    return _run_custom(ctx, handle, "custom/neg_ll_twice:sum", 2.0)


# ----------------------------------------------------------------------------- TrainingClient


@recipe("TrainingClient.forward")
def _forward(ctx: Ctx, call: Caller) -> str:
    out = call(ctx.tc, "forward", ctx.batch, "cross_entropy")
    shapes = [o["logprobs"].to_numpy().shape for o in out.loss_fn_outputs]
    assert shapes == [(d.model_input.length,) for d in ctx.batch], shapes
    assert np.isfinite(loss_sum(out))
    return "logprob shapes match, loss finite"


@recipe("TrainingClient.forward_backward")
def _forward_backward(ctx: Ctx, call: Caller) -> str:
    tc = ctx.new_tc(seed=4)
    out = call(tc, "forward_backward", ctx.batch, "cross_entropy")
    fwd = result(tc.forward(ctx.batch, "cross_entropy"))
    assert np.isclose(loss_sum(out), loss_sum(fwd), rtol=1e-4), (out.metrics, fwd.metrics)
    return "loss:sum equals forward's"


@recipe("TrainingClient.forward_backward_custom")
def _fb_custom(ctx: Ctx, call: Caller) -> str:
    torch = _torch()

    def custom_ce(data: Any, logprobs_list: Any) -> Any:
        loss = torch.zeros(())
        for datum, lp in zip(data, logprobs_list, strict=True):
            loss = loss - (lp * torch.tensor(datum.loss_fn_inputs["weights"].to_numpy())).sum()
        return loss, {"custom_ce:sum": float(loss.detach())}

    a, b = ctx.new_tc(seed=5), ctx.new_tc(seed=5)
    out = call(a, "forward_backward_custom", ctx.batch, custom_ce)
    ce = result(b.forward_backward(ctx.batch, "cross_entropy"))
    assert np.isclose(out.metrics["custom_ce:sum"], loss_sum(ce), rtol=1e-4), (out.metrics, ce.metrics)
    return "client-side custom CE == cross_entropy"


@recipe("TrainingClient.optim_step")
def _optim_step(ctx: Ctx, call: Caller) -> str:
    tc = ctx.new_tc(seed=6)
    before = ctx.logprobs(tc)
    result(tc.forward_backward(ctx.batch, "cross_entropy"))
    call(tc, "optim_step", types.AdamParams(learning_rate=1e-2))
    assert not same_logprobs(before, ctx.logprobs(tc)), "optim_step changed nothing"
    return "weights move"


@recipe("TrainingClient.get_info")
def _get_info(ctx: Ctx, call: Caller) -> str:
    info = call(ctx.tc, "get_info")
    assert info.model_data.model_name == BASE_MODEL and info.model_id == ctx.tc.model_id, info
    return "model name and id"


@recipe("TrainingClient.load_state", "TrainingClient.load_state_with_optimizer")
def _load_state(ctx: Ctx, call: Caller) -> str:
    path, want = ctx.saved
    tc = ctx.new_tc(seed=12)
    call(tc, call.method, path)
    assert same_logprobs(want, ctx.logprobs(tc)), "loaded weights differ from the checkpoint"
    return "logprobs equal the checkpoint's"


@recipe("TrainingClient.save_state")
def _save_state(ctx: Ctx, call: Caller) -> str:
    resp = call(ctx.tc, "save_state", _uniq("save"))
    assert resp.path.startswith("tinker://") and "/weights/" in resp.path, resp
    c = ctx.checkpoint(ctx.tc.model_id, resp.path)
    assert c is not None and c.checkpoint_type == "training", c
    return "listed as a training checkpoint"


@recipe("TrainingClient.save_weights_for_sampler")
def _save_for_sampler(ctx: Ctx, call: Caller) -> str:
    resp = call(ctx.tc, "save_weights_for_sampler", _uniq("sw"))
    assert resp.path.startswith("tinker://") and "/sampler_weights/" in resp.path, resp
    assert ctx.checkpoint(ctx.tc.model_id, resp.path).checkpoint_type == "sampler"
    return "listed as a sampler checkpoint"


@recipe("TrainingClient.save_weights_and_get_sampling_client",
        "TrainingClient.save_weights_and_get_sampling_client_submit")  # 0.18: the future-returning form
def _save_and_sample(ctx: Ctx, call: Caller) -> str:
    sc = call(ctx.tc, call.method)
    check_sample(result(sc.sample(ctx.prompt, 2, types.SamplingParams(max_tokens=4, seed=2))), 2, 4)
    return "returns a working SamplingClient"


@recipe("TrainingClient.create_sampling_client")
def _tc_create_sampling(ctx: Ctx, call: Caller) -> str:
    sc = call(ctx.tc, "create_sampling_client", ctx.sampler_path)
    check_sample(result(sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=4, seed=1))), 1, 4)
    return "samples"


@recipe("TrainingClient.save_weights_external")
def _save_external(ctx: Ctx, call: Caller) -> str:
    resp = call(ctx.tc, "save_weights_external", _uniq("ext"))
    path = resp.path
    assert path.startswith("tinker://"), resp
    urls = result(ctx.rest.get_external_weights_urls(path)).urls
    assert "adapter_model.safetensors" in " ".join(urls), urls
    return "PEFT export; get_external_weights_urls lists its files"


# ----------------------------------------------------------------------------- SamplingClient


@recipe("SamplingClient.sample")
def _sample(ctx: Ctx, call: Caller) -> str:
    resp = call(ctx.sc, "sample", ctx.prompt, 2, types.SamplingParams(max_tokens=6, seed=3))
    check_sample(resp, 2, 6)
    return "2 sequences, finite logprobs"


@recipe("SamplingClient.compute_logprobs")
def _compute_logprobs(ctx: Ctx, call: Caller) -> str:
    lps = call(ctx.sc, "compute_logprobs", ctx.prompt)
    assert len(lps) == ctx.prompt.length and lps[0] is None, lps
    assert all(np.isfinite(lps[1:])) and max(lps[1:]) <= 1e-6, lps
    return "one logprob per prompt token, first None"


@recipe("SamplingClient.get_base_model")
def _sc_base_model(ctx: Ctx, call: Caller) -> str:
    assert call(ctx.sc, "get_base_model") == BASE_MODEL
    return BASE_MODEL


@recipe("SamplingClient.create")
def _sc_create(ctx: Ctx, call: Caller) -> str:
    sc = result(tinker.SamplingClient.create(ctx.service.holder, model_path=ctx.sampler_path))
    check_sample(result(sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=3, seed=1))), 1, 3)
    return "from the session holder and a sampler path"


@recipe("SamplingClient.get_sampler_handle", "SamplingClient.from_sampler_handle")
def _sampler_handle(ctx: Ctx, call: Caller) -> str:
    handle = ctx.sc.get_sampler_handle()
    assert isinstance(handle, str) and handle, handle
    sc = tinker.SamplingClient.from_sampler_handle(handle)
    a = result(sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=5, seed=11))).sequences[0].tokens
    b = result(ctx.sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=5, seed=11))).sequences[0].tokens
    assert a == b, (a, b)
    return "a handle rebuilds a client on the same sampler (same seed, same tokens)"


# ----------------------------------------------------------------------------- RestClient


def _rest_recipe(*names: str) -> Callable[[Recipe], Recipe]:
    """A recipe registered under RestClient.<name>; `call` is a _RestMark there."""
    def deco(fn: Recipe) -> Recipe:
        for n in names:
            key = f"RestClient.{n}"
            assert key not in RECIPES
            RECIPES[key] = lambda ctx, call, fn=fn: fn(ctx, _RestMark(call.is_async, call.method, call.timeout))
        return fn

    return deco


_rest_recipe("get_server_capabilities")(_capabilities)
_rest_recipe("copy_weights")(_copy_weights)


@recipe("RestClient.list_training_runs")
def _list_runs(ctx: Ctx, call: Caller) -> str:
    ctx.tc  # noqa: B018
    page = call(ctx.rest, "list_training_runs", limit=2)
    assert page.cursor.limit == 2 and page.cursor.total_count >= 1 and 1 <= len(page.training_runs) <= 2, page
    return f"paged; total {page.cursor.total_count}"


@recipe("RestClient.get_training_run")
def _get_run(ctx: Ctx, call: Caller) -> str:
    run = call(ctx.rest, "get_training_run", ctx.tc.model_id)
    assert run.training_run_id == ctx.tc.model_id and run.base_model == BASE_MODEL, run
    return "id and base model"


@recipe("RestClient.get_training_run_by_tinker_path")
def _get_run_by_path(ctx: Ctx, call: Caller) -> str:
    run = call(ctx.rest, "get_training_run_by_tinker_path", ctx.state_path)
    assert run.training_run_id == ctx.tc.model_id, run
    return "the path's run"


@recipe("RestClient.get_weights_info_by_tinker_path")
def _weights_info(ctx: Ctx, call: Caller) -> str:
    info = call(ctx.rest, "get_weights_info_by_tinker_path", ctx.state_path)
    assert info.base_model == BASE_MODEL and info.is_lora and info.lora_rank == 8, info
    return "base model, LoRA rank"


@recipe("RestClient.list_checkpoints")
def _list_ckpts(ctx: Ctx, call: Caller) -> str:
    paths = {c.tinker_path for c in call(ctx.rest, "list_checkpoints", ctx.tc.model_id).checkpoints}
    assert {ctx.state_path, ctx.sampler_path} <= paths, paths
    return "lists the run's training and sampler checkpoints"


@recipe("RestClient.list_user_checkpoints")
def _list_user_ckpts(ctx: Ctx, call: Caller) -> str:
    ctx.sampler_path  # noqa: B018
    page = call(ctx.rest, "list_user_checkpoints", limit=1000)
    paths = {c.tinker_path for c in page.checkpoints}
    assert ctx.state_path in paths, (ctx.state_path, len(paths))
    return f"{len(paths)} checkpoints"


def _fresh_ckpt(ctx: Ctx) -> tuple[Any, str]:
    tc = ctx.new_tc(seed=2)
    return tc, result(tc.save_state(_uniq("del"))).path


@recipe("RestClient.delete_checkpoint")
def _delete(ctx: Ctx, call: Caller) -> str:
    tc, path = _fresh_ckpt(ctx)
    call(ctx.rest, "delete_checkpoint", tc.model_id, "weights/" + path.rsplit("/", 1)[1])
    assert ctx.checkpoint(tc.model_id, path) is None, "still listed"
    return "gone from the listing"


@recipe("RestClient.delete_checkpoint_from_tinker_path")
def _delete_path(ctx: Ctx, call: Caller) -> str:
    tc, path = _fresh_ckpt(ctx)
    call(ctx.rest, "delete_checkpoint_from_tinker_path", path)
    assert ctx.checkpoint(tc.model_id, path) is None, "still listed"
    return "gone from the listing"


@recipe("RestClient.publish_checkpoint_from_tinker_path", "RestClient.unpublish_checkpoint_from_tinker_path")
def _publish(ctx: Ctx, call: Caller) -> str:
    tc, path = _fresh_ckpt(ctx)
    if call.method == "publish_checkpoint_from_tinker_path":
        call(ctx.rest, call.method, path)
        assert ctx.checkpoint(tc.model_id, path).public is True
        return "public flag set"
    result(ctx.rest.publish_checkpoint_from_tinker_path(path))
    call(ctx.rest, call.method, path)
    assert ctx.checkpoint(tc.model_id, path).public is False
    return "public flag cleared"


@recipe("RestClient.set_checkpoint_ttl_from_tinker_path")
def _ttl(ctx: Ctx, call: Caller) -> str:
    tc, path = _fresh_ckpt(ctx)
    call(ctx.rest, "set_checkpoint_ttl_from_tinker_path", path, 3600)
    c = ctx.checkpoint(tc.model_id, path)
    left = (c.expires_at - datetime.now(c.expires_at.tzinfo)).total_seconds()
    assert 3000 < left <= 3700, left
    call(ctx.rest, "set_checkpoint_ttl_from_tinker_path", path, None)
    assert ctx.checkpoint(tc.model_id, path).expires_at is None
    return "expires_at set, then cleared"


@recipe("RestClient.get_external_weights_urls")
def _ext_urls(ctx: Ctx, call: Caller) -> str:
    path = result(ctx.tc.save_weights_external(_uniq("ext"))).path
    urls = call(ctx.rest, "get_external_weights_urls", path).urls
    assert urls and all(u.startswith("http") for u in urls.values()), urls
    name, url = next((k, v) for k, v in urls.items() if k.endswith(".json"))
    with urllib.request.urlopen(url, timeout=30) as r:
        json.loads(r.read())
    return f"{len(urls)} signed URLs; {name} downloads"


@recipe("RestClient.get_checkpoint_archive_url", "RestClient.get_checkpoint_archive_url_from_tinker_path")
def _archive(ctx: Ctx, call: Caller) -> str:
    run, kind_name = ctx.tc.model_id, ctx.state_path.split(ctx.tc.model_id + "/", 1)[1]
    if call.method == "get_checkpoint_archive_url":
        resp = call(ctx.rest, "get_checkpoint_archive_url", run, kind_name)
    else:
        resp = call(ctx.rest, "get_checkpoint_archive_url_from_tinker_path", ctx.state_path)
    with urllib.request.urlopen(resp.url, timeout=60) as r:
        data = r.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = {n.rsplit("/", 1)[-1] for n in tar.getnames()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names, names
    return "tar with a PEFT adapter"


@recipe("RestClient.get_sampler")
def _get_sampler(ctx: Ctx, call: Caller) -> str:
    resp = call(ctx.rest, "get_sampler", ctx.sampler_id)
    assert resp.base_model == BASE_MODEL, resp
    return "base model of the sampling session"


@recipe("RestClient.list_sessions")
def _list_sessions(ctx: Ctx, call: Caller) -> str:
    sid = ctx.session_id
    resp = call(ctx.rest, "list_sessions", limit=100)
    assert sid in resp.sessions, (sid, resp.sessions[:5])
    return "lists this session"


@recipe("RestClient.get_session")
def _get_session(ctx: Ctx, call: Caller) -> str:
    ctx.tc  # noqa: B018
    resp = call(ctx.rest, "get_session", ctx.session_id)
    assert ctx.tc.model_id in resp.training_run_ids, resp
    return "its training runs"


@recipe("RestClient.search_sessions")
def _search_sessions(ctx: Ctx, call: Caller) -> str:
    ctx.tc  # noqa: B018
    resp = call(ctx.rest, "search_sessions", types.SessionSearchRequest(session_id=ctx.session_id, limit=5))
    ids = [s.session_id for s in resp.sessions]
    assert ids == [ctx.session_id], ids
    return "finds the session by id"


@recipe("RestClient.assign_session_project")
def _assign_project(ctx: Ctx, call: Caller) -> str:
    call(ctx.rest, "assign_session_project", ctx.session_id, "default")
    return "session moved to project 'default'"


@recipe("RestClient.export_session_trace")
def _export_trace(ctx: Ctx, call: Caller) -> str:
    ctx.tc  # noqa: B018
    url = call(ctx.rest, "export_session_trace", ctx.session_id)
    assert isinstance(url, str) and url.startswith("http"), url
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    assert data, "empty trace"
    if data[:1] in (b"{", b"["):  # Chrome JSON trace format
        trace = json.loads(data)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        assert isinstance(events, list) and events, str(trace)[:200]
        return f"Chrome JSON trace, {len(events)} events"
    # Perfetto protobuf: a Trace is repeated TracePacket, field 1, length-delimited (tag 0x0a).
    assert data[:1] == b"\x0a", f"neither a JSON nor a Perfetto trace: {data[:16]!r}"
    return f"Perfetto protobuf trace, {len(data)} bytes"


@recipe("RestClient.whoami")
def _whoami(ctx: Ctx, call: Caller) -> str:
    who = call(ctx.rest, "whoami")
    assert who.user_urn, who
    return f"user {who.user_urn}"


def _admin_obj(ctx: Ctx, call: Caller) -> Any:
    return ctx.rest if isinstance(call, _RestMark) else ctx.admin


def _billing_usage(ctx: Ctx, call: Caller) -> str:
    ctx.tc  # noqa: B018
    now = datetime.now(timezone.utc)
    resp = call(_admin_obj(ctx, call), "get_billing_usage", now - timedelta(days=1), now + timedelta(hours=1))
    assert isinstance(resp.data, list), resp
    assert any(getattr(e.event_info, "type", "") == "training" for e in resp.data), resp.data[:3]
    return f"{len(resp.data)} usage events (training included)"


def _storage_usage(ctx: Ctx, call: Caller) -> str:
    ctx.state_path  # noqa: B018
    resp = call(_admin_obj(ctx, call), "get_current_checkpoint_storage_usage")
    assert resp.data and sum(i.size_bytes for i in resp.data) > 0, resp
    return f"{sum(i.checkpoint_count for i in resp.data)} checkpoints, {sum(i.size_bytes for i in resp.data)} bytes"


def _audit_log(ctx: Ctx, call: Caller) -> str:
    ctx.state_path  # noqa: B018
    resp = call(_admin_obj(ctx, call), "get_audit_log")
    assert isinstance(resp.entries, list) and resp.entries, resp
    return f"{len(resp.entries)} entries"


for _name, _fn in (("get_billing_usage", _billing_usage), ("get_current_checkpoint_storage_usage", _storage_usage),
                   ("get_audit_log", _audit_log)):
    recipe(f"AdminClient.{_name}")(_fn)
    _rest_recipe(_name)(_fn)


# ----------------------------------------------------------------------------- losses


RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce")


def rl_batch(ctx: Ctx, sequence_ratio_mask: bool = False) -> list[Any]:
    """Datums with sampling logprobs (the reference run's own) and +/- advantages; with
    sequence_ratio_mask (gspo's required input) marking every position."""
    base = ctx.logprobs(ctx.tc)
    out = []
    for i, (d, lp) in enumerate(zip(ctx.batch, base, strict=True)):
        n = len(lp)
        inputs = {
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "logprobs": types.TensorData.from_numpy(lp.astype(np.float32)),
            "advantages": types.TensorData.from_numpy(np.full(n, 1.0 if i % 2 == 0 else -0.5, np.float32)),
        }
        if sequence_ratio_mask:
            inputs["sequence_ratio_mask"] = types.TensorData.from_numpy(np.ones(n, np.float32))
        out.append(types.Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    return out


def _loss(name: str) -> Recipe:
    def run(ctx: Ctx, call: Caller) -> str:
        tc = ctx.new_tc(seed=7)
        batch = ctx.batch if name == "cross_entropy" else rl_batch(ctx, sequence_ratio_mask=name == "gspo")
        out = result(tc.forward_backward(batch, name))
        shapes = [o["logprobs"].to_numpy().shape for o in out.loss_fn_outputs]
        assert shapes == [(d.model_input.length,) for d in batch], shapes
        assert np.isfinite(loss_sum(out)), out.metrics
        before = ctx.logprobs(tc)
        result(tc.optim_step(types.AdamParams(learning_rate=1e-2)))
        assert not same_logprobs(before, ctx.logprobs(tc)), "the loss's gradient moved nothing"
        return f"loss:sum {loss_sum(out):.4g}; its gradient moves the weights"

    return run


for _l in ("cross_entropy",) + RL_LOSSES:
    recipe(f"loss:{_l}")(_loss(_l))


# ----------------------------------------------------------------------------- optimizers


def _optim_params(cls_name: str) -> Recipe:
    def run(ctx: Ctx, call: Caller) -> str:
        cls = getattr(types, cls_name)
        kw: dict[str, Any] = {}
        if cls_name != "AdamParams":  # another family: make the run with its config
            family = cls.model_fields["type"].default
            cfgs = [c for c in _config_classes() if c.model_fields["type"].default == family]
            assert cfgs, f"no OptimizerConfig for {family}"
            kw["optimizer"] = cfgs[0]()
        tc = ctx.new_tc(seed=8, **kw)
        before = ctx.logprobs(tc)
        result(tc.forward_backward(ctx.batch, "cross_entropy"))
        result(tc.optim_step(cls(learning_rate=1e-2)))
        assert not same_logprobs(before, ctx.logprobs(tc)), "optim_step changed nothing"
        return "a step moves the weights"

    return run


def _config_classes() -> list[type]:
    from surface_enum import _concrete, _union_members

    return _concrete(_union_members(types.OptimizerConfig))


def _optimizer_config(cls_name: str) -> Recipe:
    def run(ctx: Ctx, call: Caller) -> str:
        cfg = getattr(types, cls_name)()
        tc = ctx.new_tc(seed=8, optimizer=cfg)
        params_cls = next(c for c in (types.AdamParams, getattr(types, "DimuonParams", None))
                          if c is not None and ("type" not in c.model_fields and cfg.type == "adamw"
                                                or "type" in c.model_fields and c.model_fields["type"].default == cfg.type))
        before = ctx.logprobs(tc)
        result(tc.forward_backward(ctx.batch, "cross_entropy"))
        result(tc.optim_step(params_cls(learning_rate=1e-2)))
        assert not same_logprobs(before, ctx.logprobs(tc)), "optim_step changed nothing"
        return f"run created with optimizer {cfg.type}; a step moves the weights"

    return run


for _c in ("AdamParams", "DimuonParams"):
    recipe(f"optim_params:{_c}")(_optim_params(_c))
for _c in ("AdamOptimizerConfig", "DimuonOptimizerConfig"):
    recipe(f"optimizer_config:{_c}")(_optimizer_config(_c))


# ----------------------------------------------------------------------------- sampling


def _sample(ctx: Ctx, n: int = 1, prompt: Any = None, **kw: Any) -> Any:
    extra = {k: kw.pop(k) for k in list(kw) if k not in types.SamplingParams.model_fields}
    return result(ctx.sc.sample(prompt or ctx.prompt, n, types.SamplingParams(**kw), **extra))


@recipe("sampling_param:max_tokens")
def _sp_max_tokens(ctx: Ctx, call: Caller) -> str:
    for m in (1, 7):
        r = _sample(ctx, max_tokens=m, seed=1)
        check_sample(r, 1, m)
    return "length bounded"


@recipe("sampling_param:seed")
def _sp_seed(ctx: Ctx, call: Caller) -> str:
    a, b = (_sample(ctx, 2, max_tokens=10, seed=123) for _ in range(2))
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences], "same seed, other output"
    outs = {tuple(_sample(ctx, max_tokens=10, seed=s).sequences[0].tokens) for s in range(1, 6)}
    assert len(outs) > 1, "different seeds gave one output"
    return "reproducible; different seeds differ"


@recipe("sampling_param:temperature")
def _sp_temperature(ctx: Ctx, call: Caller) -> str:
    cold = {tuple(_sample(ctx, max_tokens=8, temperature=1e-6, seed=s).sequences[0].tokens) for s in (1, 2, 3)}
    greedy = {tuple(_sample(ctx, max_tokens=8, top_k=1, seed=s).sequences[0].tokens) for s in (1, 2)}
    assert len(cold) == 1 and cold == greedy, (cold, greedy)
    return "temperature ~0 is greedy"


@recipe("sampling_param:top_k")
def _sp_top_k(ctx: Ctx, call: Caller) -> str:
    greedy = {tuple(_sample(ctx, max_tokens=8, top_k=1, seed=s).sequences[0].tokens) for s in (1, 2, 3)}
    assert len(greedy) == 1, greedy
    return "top_k=1 is greedy"


@recipe("sampling_param:top_p")
def _sp_top_p(ctx: Ctx, call: Caller) -> str:
    nucleus = {tuple(_sample(ctx, max_tokens=8, top_p=1e-6, seed=s).sequences[0].tokens) for s in (1, 2, 3)}
    greedy = {tuple(_sample(ctx, max_tokens=8, top_k=1, seed=1).sequences[0].tokens)}
    assert nucleus == greedy, (nucleus, greedy)
    return "top_p~0 is greedy"


@recipe("sampling_param:stop")
def _sp_stop(ctx: Ctx, call: Caller) -> str:
    base = _sample(ctx, max_tokens=16, seed=77).sequences[0].tokens
    tok = base[min(3, len(base) - 1)]
    k = base.index(tok)
    s = _sample(ctx, max_tokens=16, seed=77, stop=[tok]).sequences[0]
    assert s.stop_reason == "stop" and s.tokens == base[: k + 1], (s.tokens, base)
    return "stop token ends the sequence"


@recipe("sample_arg:prompt", "sample_arg:sampling_params")
def _sa_prompt(ctx: Ctx, call: Caller) -> str:
    check_sample(_sample(ctx, max_tokens=4, seed=1), 1, 4)
    return "required; exercised by every sample"


@recipe("sample_arg:num_samples")
def _sa_num(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, 4, max_tokens=4, seed=1)
    check_sample(r, 4, 4)
    return "4 sequences"


@recipe("sample_arg:include_prompt_logprobs")
def _sa_prompt_lp(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, max_tokens=2, seed=1, include_prompt_logprobs=True)
    lps = r.prompt_logprobs
    assert lps is not None and len(lps) == ctx.prompt.length and lps[0] is None, lps
    want = result(ctx.sc.compute_logprobs(ctx.prompt))
    np.testing.assert_allclose(np.array(lps[1:], float), np.array(want[1:], float), atol=1e-4)
    return "equal compute_logprobs"


@recipe("sample_arg:topk_prompt_logprobs")
def _sa_topk_prompt(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, max_tokens=2, seed=1, include_prompt_logprobs=True, topk_prompt_logprobs=3)
    topk = r.topk_prompt_logprobs
    assert topk is not None and len(topk) == ctx.prompt.length and topk[0] is None, topk
    for row in topk[1:]:
        lps = [lp for _, lp in row]
        assert 1 <= len(row) <= 3 and lps == sorted(lps, reverse=True), row
    return "k sorted alternatives per prompt position"


@recipe("sample_arg:topk_sample_logprobs")
def _sa_topk_sample(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, max_tokens=4, seed=1, topk_sample_logprobs=3)
    s = r.sequences[0]
    topk = s.topk_logprobs
    assert topk is not None and len(topk) == len(s.tokens), topk
    for tok, lp, row in zip(s.tokens, s.logprobs, topk, strict=True):
        assert 1 <= len(row) <= 3 and row[0][1] >= lp - 1e-4, (tok, lp, row)
    return "k alternatives per sampled token"


@recipe("sample_arg:target_prompt_logprobs")
def _sa_target(ctx: Ctx, call: Caller) -> str:
    n = ctx.prompt.length
    toks = ctx.prompt.to_ints()
    # Shape [len(prompt) - 1, K]: row i is scored at prompt position i + 1.
    target = types.TensorData.from_numpy(np.array([[t] for t in toks[1:]], dtype=np.int64))
    r = _sample(ctx, max_tokens=2, seed=1, target_prompt_logprobs=target)
    assert r.target_prompt_logprobs is not None, r
    got = np.asarray(r.target_prompt_logprobs.to_numpy(), float).reshape(n - 1, -1)
    want = result(ctx.sc.compute_logprobs(ctx.prompt))
    np.testing.assert_allclose(got[:, 0], np.array(want[1:], float), atol=1e-4)
    return "target logprobs equal compute_logprobs"


@recipe("sample_arg:prompt_alt_tokens_k")
def _sa_alt(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, max_tokens=2, seed=1, prompt_alt_tokens_k=2)
    alt = r.prompt_alt_tokens
    assert alt is not None, r
    return f"alt tokens {type(alt).__name__}"


@recipe("sample_arg:prompt_logprobs_last_n")
def _sa_last_n(ctx: Ctx, call: Caller) -> str:
    r = _sample(ctx, max_tokens=2, seed=1, include_prompt_logprobs=True, prompt_logprobs_last_n=2)
    lps = r.prompt_logprobs
    assert lps is not None and sum(x is not None for x in lps) == 2, lps
    return "logprobs for the last 2 prompt tokens only"


# ----------------------------------------------------------------------------- chunks


@recipe("chunk:EncodedTextChunk")
def _chunk_text(ctx: Ctx, call: Caller) -> str:
    toks = ctx.prompt.to_ints()
    mi = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=toks[:2]), types.EncodedTextChunk(tokens=toks[2:])])
    a = result(ctx.sc.sample(mi, 1, types.SamplingParams(max_tokens=5, seed=4))).sequences[0].tokens
    b = result(ctx.sc.sample(ctx.prompt, 1, types.SamplingParams(max_tokens=5, seed=4))).sequences[0].tokens
    assert a == b, (a, b)
    return "two chunks == one"


def _sample_with_chunk(ctx: Ctx, chunk: Any) -> str:
    mi = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=ctx.prompt.to_ints()), chunk])
    result(ctx.sc.sample(mi, 1, types.SamplingParams(max_tokens=2, seed=1)))
    return "accepted"


PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc000000301010018dd8db40000000049454e44ae426082")


@recipe("chunk:ImageChunk")
def _chunk_image(ctx: Ctx, call: Caller) -> str:
    return _sample_with_chunk(ctx, types.ImageChunk(data=PNG_1PX, format="png", expected_tokens=1))


@recipe("chunk:ImageAssetPointerChunk")
def _chunk_image_ptr(ctx: Ctx, call: Caller) -> str:
    return _sample_with_chunk(ctx, types.ImageAssetPointerChunk(
        format="png", location="https://example.invalid/x.png", expected_tokens=1))


@recipe("chunk:DmelChunk")
def _chunk_dmel(ctx: Ctx, call: Caller) -> str:
    # A TensorContainer: dtype byte, ndim, dims (varints), then the payload; shape [1, 8].
    return _sample_with_chunk(ctx, types.DmelChunk(dmel=bytes([0, 2, 1, 8]) + bytes(32)))
