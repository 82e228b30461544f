"""The installed tinker SDK's public surface, found by introspection (no hand-written list).

`surface_items()` enumerates, for whichever tinker release is importable:
- every public method of ServiceClient, TrainingClient, SamplingClient, RestClient and
  AdminClient, sync and async forms (deprecated aliases included: each counts as a method);
- every `LossFnType` value;
- every optimizer type: the per-step `OptimParams` classes (AdamParams and each
  `OptimParamsBase` subclass) and the creation-time `OptimizerConfig` classes;
- every `SamplingParams` field and every argument of `SamplingClient.sample`;
- every `ModelInput` chunk type (the members of the `ModelInputChunk` union).

Each item is called against `loops serve` by tests/sdk_matrix/test_surface.py through a
recipe in surface_recipes.py; an item without a recipe fails as *unclassified*.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass

CLIENTS = ("ServiceClient", "TrainingClient", "SamplingClient", "RestClient", "AdminClient")


@dataclass(frozen=True)
class Item:
    """One element of the SDK's surface."""

    id: str  # "RestClient.whoami_async", "loss:gspo", "sampling_param:top_k", ...
    group: str  # a client name, or loss / optim_params / optimizer_config / sampling_param / sample_arg / chunk
    name: str  # the method's name without `_async`, or the value / field / class name
    is_async: bool = False
    deprecated: bool = False

    @property
    def key(self) -> str:
        """The recipe this item runs: sync and async forms of a method share one."""
        return f"{self.group}.{self.name}" if self.group in CLIENTS else f"{self.group}:{self.name}"


def client_class(name: str) -> type | None:
    """The class of a public client; RestClient lives in public_interfaces before 0.3x's export."""
    import tinker

    cls = getattr(tinker, name, None)
    if cls is not None:
        return cls
    for mod in ("tinker.lib.public_interfaces", f"tinker.lib.public_interfaces.{_snake(name)}"):
        try:
            cls = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            cls = None
        if cls is not None:
            return cls
    return None


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def _is_deprecated(fn: object) -> bool:
    return getattr(fn, "__deprecated__", None) is not None or "DEPRECATED" in (inspect.getdoc(fn) or "")[:40]


def method_items() -> list[Item]:
    items: list[Item] = []
    for group in CLIENTS:
        cls = client_class(group)
        if cls is None:
            continue
        for name in sorted(dir(cls)):
            if name.startswith("_"):
                continue
            fn = inspect.getattr_static(cls, name)
            if isinstance(fn, (staticmethod, classmethod)):
                fn = fn.__func__
            if isinstance(fn, property) or not callable(fn):
                continue
            is_async = name.endswith("_async")
            base = name.removesuffix("_async") if is_async else name
            items.append(Item(f"{group}.{name}", group, base, is_async, _is_deprecated(fn)))
    return items


def _union_members(tp: object) -> list[object]:
    """The members of a (possibly Annotated) Union, flattened."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    args = typing.get_args(tp)
    if not args:
        return [tp]
    out: list[object] = []
    for a in args:
        out += _union_members(a)
    return out


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out += _subclasses(sub)
    return out


def _concrete(members: list[object]) -> list[type]:
    """Classes of a union; an abstract `*Base` member stands for its concrete subclasses."""
    seen: dict[str, type] = {}
    for m in members:
        if not isinstance(m, type):
            continue
        for c in ([m] if not m.__name__.endswith("Base") else _subclasses(m)):
            seen.setdefault(c.__name__, c)
    return list(seen.values())


def dimension_items() -> list[Item]:
    import tinker
    from tinker import types

    items: list[Item] = []
    loss_t = getattr(types, "LossFnType", None)
    for v in typing.get_args(loss_t) if loss_t is not None else ():
        items.append(Item(f"loss:{v}", "loss", v))
    optim = getattr(types, "OptimParams", None)
    optim_classes = _concrete(_union_members(optim)) if optim is not None else [types.AdamParams]
    for c in optim_classes:
        items.append(Item(f"optim_params:{c.__name__}", "optim_params", c.__name__))
    config = getattr(types, "OptimizerConfig", None)
    for c in _concrete(_union_members(config)) if config is not None else []:
        items.append(Item(f"optimizer_config:{c.__name__}", "optimizer_config", c.__name__))
    for f in types.SamplingParams.model_fields:
        items.append(Item(f"sampling_param:{f}", "sampling_param", f))
    for p in list(inspect.signature(tinker.SamplingClient.sample).parameters)[1:]:
        items.append(Item(f"sample_arg:{p}", "sample_arg", p))
    for c in _concrete(_union_members(types.ModelInputChunk)):
        items.append(Item(f"chunk:{c.__name__}", "chunk", c.__name__))
    return items


def surface_items() -> list[Item]:
    """Everything the installed SDK exposes that the surface matrix classifies."""
    return method_items() + dimension_items()


if __name__ == "__main__":
    import tinker

    print(f"tinker {tinker.__version__}")
    for it in surface_items():
        print(it.id, "(deprecated)" if it.deprecated else "")
