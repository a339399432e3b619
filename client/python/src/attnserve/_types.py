"""The client's result types and its one exception type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import grpc
import numpy as np


class Error(Exception):
    """Every failure of a call, from the server or from the client's checks.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``), e.g.
            ``INVALID_ARGUMENT`` (a bad request; the message names the field,
            e.g. ``keys: expected shape (2, Lk, 2), got (3, 10, 2)``; do not
            retry), ``NOT_FOUND`` (an unknown ``weights_name``),
            ``RESOURCE_EXHAUSTED`` (over a server limit, or its queue is full:
            the message says which), ``DEADLINE_EXCEEDED``, ``CANCELLED``,
            ``UNAVAILABLE`` (no server there, or it is draining: retry, on
            another replica).
        message: the server's message (or the client's, for arguments it
            refuses before sending: those are ``INVALID_ARGUMENT`` too).
        rpc: the RPC that failed, e.g. ``"ScaledDotProductAttention"``, or
            ``""`` for a check made before any call.

    ``str(error)`` reads ``"INVALID_ARGUMENT: keys: expected shape ..."``, as
    attnctl prints it. The underlying ``grpc.RpcError``, if any, is the
    exception's ``__cause__``.
    """

    def __init__(self, code: grpc.StatusCode, message: str, rpc: str = "") -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.rpc = rpc

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, rpc: str) -> "Error":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", rpc)


def invalid(message: str) -> Error:
    """A request the client refuses before sending it."""
    return Error(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class ExecutionInfo:
    """Which implementation ran the call, and how long it took on the server.

    ``implementation`` is the kernel that ran, e.g. ``"cpu-fused-blocks"``,
    ``"cpu-lane"``, ``"cuda-fused-attention"`` or ``"reference"``;
    ``kernel_seconds`` the kernel alone, ``queue_seconds`` the wait for a
    worker.
    """

    implementation: str
    kernel_seconds: float
    queue_seconds: float


@dataclass(frozen=True, eq=False)
class Result:
    """The result of ``masked_softmax`` and ``batch_matmul``.

    ``output`` is a writable float32 array (the shapes are on each method).
    """

    output: np.ndarray
    info: ExecutionInfo


@dataclass(frozen=True, eq=False)
class AttentionResult:
    """The result of the attention and regression calls.

    ``output``: float32, e.g. (B, Lq, v) for attention, (m,) for regression.
    ``weights``: float32 attention weights, e.g. (B, Lq, Lk) or (m, n), when
    the call asked for them (``return_weights=True``), else ``None``; masked
    keys have exactly 0 and rows with valid length 0 are all zero.
    """

    output: np.ndarray
    weights: Optional[np.ndarray]
    info: ExecutionInfo


@dataclass(frozen=True, eq=False)
class FitResult:
    """The result of ``fit_bandwidth``.

    ``bandwidth``: the fitted w (only w**2 enters the model, so its sign
    carries no meaning); ``loss_per_epoch``: float64 (epochs,), the loss
    before each epoch's step; ``final_loss``: the loss at ``bandwidth``.
    """

    bandwidth: float
    loss_per_epoch: np.ndarray
    final_loss: float
    info: ExecutionInfo


@dataclass(frozen=True, eq=False)
class AdditiveWeights:
    """The MLP scoring parameters of additive attention, inline:
    ``w_q`` (h, q), ``w_k`` (h, k), ``w_v`` (h,); the score of query q and key
    k is ``w_v . tanh(w_q @ q + w_k @ k)``. A plain tuple ``(w_q, w_k, w_v)``
    or a mapping with these keys works as well."""

    w_q: Any
    w_k: Any
    w_v: Any


@dataclass(frozen=True)
class ModelInfo:
    """One model of the server (KServe's RepositoryIndex): built-in models
    (``masked_softmax``, ``dot_product_attention``, ...) and those of its
    model repository (``additive_attention`` weights usable as
    ``weights_name``, fitted Nadaraya-Watson bandwidths). ``state`` is e.g.
    ``"READY"``."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True)
class Appended:
    """What an append did (``Client.append_memory``): ``first_row``, the
    index of the first row it added (its column in ``attention_weights``
    from now on); ``rows``, the rows the model holds after it; ``files``, the
    files they are stored in on the server; ``evicted``, the oldest rows a
    ``max_rows`` window dropped with it (every row's index moved down by
    that many)."""

    first_row: int
    rows: int
    files: int
    evicted: int = 0


@dataclass(frozen=True)
class Evicted:
    """What an eviction did (``Client.evict_memory``): ``evicted``, the rows
    it dropped (the oldest); ``rows``, the rows the model holds after it."""

    evicted: int
    rows: int
