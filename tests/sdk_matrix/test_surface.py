"""The tinker surface matrix: every public method and argument of the installed SDK
(enumerated by surface_enum.py, not listed by hand) called against `loops serve`.

Each item ends as one of
- served: the call succeeded and its answer passed the recipe's sanity check;
- refused: the server answered an error that says why (4xx, or 501), recorded verbatim;
- not served: the route answers Loops' generic 404 "… is not supported by Loops" (a hole);
- n/a: the client lacks something the call needs (torch), no request was made;
- failing: a wrong answer, a 5xx, or a client-side crash;
- unclassified: the SDK has it and surface_recipes.py has no recipe for it.
The test of an item fails when it is failing or unclassified. Results go to
$LOOPS_SDK_RESULTS/surface-<version>.json; surface.py renders tests/sdk_matrix/SURFACE.md.
"""

from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from pathlib import Path

import pytest
import tinker

from surface_enum import Item, surface_items
from surface_recipes import CLIENT_SIDE, RECIPES, Caller, Ctx, NotApplicable

ITEMS = surface_items()
SURFACE_TIMEOUT = float(os.environ.get("LOOPS_SURFACE_TIMEOUT", "60"))
_records: list[dict] = []

# The generic answer of a route Loops does not serve (compat/routes.go); anything else
# with a message is a deliberate refusal.
NOT_SERVED_MARKERS = ("is not supported by Loops", "is not a Tinker API route served by Loops")


def _short(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def classify(exc: BaseException) -> tuple[str, str]:
    """(outcome, reason) for an exception a recipe raised."""
    if isinstance(exc, NotApplicable):
        return "n/a", str(exc)
    if isinstance(exc, AssertionError):
        tb = traceback.extract_tb(exc.__traceback__)
        if tb and "site-packages/tinker/" in tb[-1].filename:
            if "incorrect event loop" in str(exc):
                # tinker <= 0.30's RestClient.get_audit_log_async runs on the caller's loop
                # instead of the SDK's, unlike every other *_async method.
                return "n/a", ("SDK defect in this release: the method asserts it runs on the SDK's "
                               "own event loop, so it fails before any request reaches the server")
            return "failing", f"SDK assertion: {exc}"
        return "failing", f"wrong answer: {exc}"
    status = getattr(exc, "status_code", None)
    if isinstance(exc, tinker.APIStatusError) and status is not None:
        msg = getattr(exc, "message", "") or str(exc)
        if status == 404 and any(m in msg for m in NOT_SERVED_MARKERS):
            return "not served", f"{status}: {msg}"
        if 400 <= status < 500 or status == 501:
            return "refused", f"{status}: {msg}"
        return "failing", f"{status}: {msg}"
    failed = getattr(tinker, "RequestFailedError", None)
    if failed is not None and isinstance(exc, failed):
        cat = getattr(exc, "category", "")
        if "server" in str(cat).lower():
            return "failing", f"request failed ({cat}): {exc}"
        return "refused", f"request failed ({cat}): {exc}"
    if isinstance(exc, RuntimeError) and "requires JWT auth" in str(exc):
        # 0.38's whoami reads the caller from a JWT; the SDK refuses before any request
        # when the server's client/config leaves pjwt_auth_enabled off.
        return "not served", f"the SDK refuses client-side: {exc} (client/config: pjwt_auth_enabled=false)"
    if isinstance(exc, (TimeoutError,)) or type(exc).__name__ in ("TimeoutError", "APITimeoutError"):
        return "failing", f"timed out: {type(exc).__name__} {exc}"
    return "failing", f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="session")
def ctx(loops_url):
    yield Ctx()
    out = os.environ.get("LOOPS_SDK_RESULTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"surface-{tinker.__version__}.json").write_text(json.dumps(
            {"version": tinker.__version__, "records": _records}, indent=1))


def run_item(item: Item, ctx: Ctx) -> dict:
    """Calls one item through its recipe and classifies the outcome."""
    fn = RECIPES.get(item.key)
    rec = {"id": item.id, "group": item.group, "async": item.is_async, "deprecated": item.deprecated,
           "client_side": item.key in CLIENT_SIDE}
    t0 = time.time()
    if fn is None:
        rec.update(outcome="unclassified",
                   reason=f"no recipe for {item.key} in tests/sdk_matrix/surface_recipes.py")
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                note = fn(ctx, Caller(item.is_async, item.name, SURFACE_TIMEOUT))
            rec.update(outcome="served", reason=note or "")
        except Exception as e:  # noqa: BLE001  (every failure is classified and recorded)
            outcome, reason = classify(e)
            rec.update(outcome=outcome, reason=_short(reason))
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


@pytest.mark.parametrize("item", ITEMS, ids=[i.id for i in ITEMS])
def test_surface(item: Item, ctx: Ctx) -> None:
    rec = run_item(item, ctx)
    _records.append(rec)
    if rec["outcome"] in ("failing", "unclassified"):
        pytest.fail(f"{item.id}: {rec['outcome']}: {rec['reason']}", pytrace=False)


def test_surface_enumeration_and_classification() -> None:
    """The enumeration finds every kind of item; an item no recipe knows is unclassified,
    a wrong answer is failing, a missing client dependency is n/a (no server needed)."""
    groups = {i.group for i in ITEMS}
    assert {"ServiceClient", "TrainingClient", "SamplingClient", "RestClient", "loss", "optim_params",
            "sampling_param", "sample_arg", "chunk"} <= groups, groups
    assert len({i.id for i in ITEMS}) == len(ITEMS), "duplicate item ids"
    assert any(i.is_async for i in ITEMS) and {"cross_entropy", "ppo"} <= {i.name for i in ITEMS if i.group == "loss"}
    new = Item("TrainingClient.some_method_of_a_future_release", "TrainingClient", "some_method_of_a_future_release")
    assert run_item(new, None)["outcome"] == "unclassified"  # type: ignore[arg-type]
    assert classify(AssertionError("logprobs differ"))[0] == "failing"
    assert classify(NotApplicable("no torch")) == ("n/a", "no torch")
    assert classify(ValueError("boom")) == ("failing", "ValueError: boom")
