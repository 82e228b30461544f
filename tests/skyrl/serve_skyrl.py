"""Starts SkyRL's Tinker-compatible server (the `skyrl` package from PyPI, JAX backend on CPU)
from a plain venv.

`python -m skyrl.tinker.api` insists on being started by `uv run`: at start-up it rebuilds a
`uv run … -m skyrl.tinker.engine` command for its engine process from its parent's command
line, and fails otherwise. This wrapper replaces that one function with the same engine
command run by this interpreter (through this file), and is otherwise SkyRL's own
`__main__`. SkyRL targets Python 3.12; on 3.11 pydantic refuses its one `typing.TypedDict`,
so both processes get typing_extensions' (the same class on 3.12). See tests/skyrl/README.md."""

from __future__ import annotations

import argparse
import runpy
import sys
import typing

import typing_extensions

if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]


def engine_command(_parent_cmd: list[str], engine_config) -> list[str]:
    from skyrl.tinker.config import config_to_argv

    return [sys.executable, __file__, "--engine", *config_to_argv(engine_config)]


def main() -> None:
    if sys.argv[1:2] == ["--engine"]:
        sys.argv = ["skyrl.tinker.engine", *sys.argv[2:]]
        runpy.run_module("skyrl.tinker.engine", run_name="__main__", alter_sys=True)
        return
    import uvicorn
    from skyrl.tinker import api
    from skyrl.tinker.config import EngineConfig, add_model

    parser = argparse.ArgumentParser(description="SkyRL tinker API server, without uv")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    api._build_uv_run_cmd_engine = engine_command
    api.app.state.engine_config = EngineConfig.model_validate(
        {k: v for k, v in vars(args).items() if k in EngineConfig.model_fields})
    uvicorn.run(api.app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
