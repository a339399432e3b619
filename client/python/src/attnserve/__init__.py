"""attnserve's Python client: the attention chapter's operations over gRPC,
numpy in and numpy out, and the chapter's pictures.

    import numpy as np, attnserve
    weights = attnserve.Client("localhost:8001").masked_softmax(
        np.random.rand(2, 2, 4), valid_lens=[2, 3]).output      # (2, 2, 4)
    attnserve.plot.show_heatmaps(weights[None], save="weights.png")

- ``attnserve.Client``: one method per RPC of attention.v1.AttentionService,
  plus ``health()`` and ``models()``; ``attnserve.aio.Client`` the same on
  asyncio.
- ``attnserve.Error``: every failure; ``.code`` is the gRPC status code.
- ``attnserve.plot``: ``show_heatmaps`` and ``plot_kernel_regression``
  (matplotlib; imported on first use).
- ``attnserve.textbook``: the chapter's toy inputs and regression data.
- the ``attnserve-plot`` command draws heatmaps and the bandwidth fit from a
  running server.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._types import (AdditiveWeights, Appended, AttentionResult, Error,
                     Evicted, ExecutionInfo, FitResult, ModelInfo, Result)
from .client import DEFAULT_MAX_MESSAGE_BYTES, Client

__version__ = "0.1.0"

__all__ = [
    "AdditiveWeights", "Appended", "AttentionResult", "Client", "DEFAULT_MAX_MESSAGE_BYTES",
    "Error", "Evicted", "ExecutionInfo", "FitResult", "ModelInfo", "Result", "aio", "plot",
    "textbook",
]

_LAZY = ("aio", "plot", "textbook")


def __getattr__(name: str) -> Any:
    # Submodules on first use: `import attnserve` stays light (no matplotlib).
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
