"""Imports the generated loops.backend.v1 / loops.v1 stubs (gen/python in the repository).

They are found on sys.path when gen/python is installed (pip install ./gen/python) or on
PYTHONPATH; otherwise this module looks for the repository's gen/python next to this source
tree (an editable install or a plain checkout) or in $LOOPS_GEN_PYTHON.
"""

from __future__ import annotations

import os
import sys


def _add_gen_python() -> None:
    cands = []
    if os.environ.get("LOOPS_GEN_PYTHON"):
        cands.append(os.environ["LOOPS_GEN_PYTHON"])
    here = os.path.dirname(os.path.abspath(__file__))
    # backends/torch/loops_worker -> repo root
    cands.append(os.path.normpath(os.path.join(here, "..", "..", "..", "gen", "python")))
    for c in cands:
        if os.path.isfile(os.path.join(c, "loops", "backend", "v1", "backend_pb2.py")):
            if c not in sys.path:
                sys.path.insert(0, c)
            return


try:  # pragma: no cover - depends on the environment
    from loops.backend.v1 import backend_pb2 as bpb  # type: ignore
except ImportError:  # pragma: no cover
    _add_gen_python()
    from loops.backend.v1 import backend_pb2 as bpb  # type: ignore

from loops.backend.v1 import backend_pb2_grpc as bgrpc  # type: ignore  # noqa: E402
from loops.v1 import types_pb2 as tpb  # type: ignore  # noqa: E402

__all__ = ["bpb", "bgrpc", "tpb"]
