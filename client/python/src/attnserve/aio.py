"""The asyncio client: ``attnserve.aio.Client``, on ``grpc.aio``.

The same methods, arguments and results as ``attnserve.Client``, as
coroutines::

    async with attnserve.aio.Client("localhost:8001") as client:
        result = await client.masked_softmax(x, valid_lens=[2, 3])

Make the client inside the event loop that uses it (grpc.aio binds a
channel to its loop). Cancelling a task cancels its call on the server too
(``asyncio.CancelledError`` propagates, as asyncio expects); every other
failure raises ``attnserve.Error``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from . import _services, _wire
from ._generated import attention_pb2_grpc
from ._types import (Appended, AttentionResult, Error, Evicted, FitResult, ModelInfo,
                     Result)
from ._wire import ArrayLike, LengthsLike, WeightsLike
from .client import (DEFAULT_MAX_MESSAGE_BYTES, Metadata, Precision, Timeout,
                     channel_options)

_UNSET: Any = object()

__all__ = ["Client"]


class Client:
    """An asyncio client of attnserve's typed API; see ``attnserve.Client``
    for the arguments (the same here), the tensor conventions and errors."""

    def __init__(self, target: str, *, timeout: Timeout = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 metadata: Metadata = (),
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        opts = channel_options(max_message_bytes, options)
        if credentials is None:
            channel = grpc.aio.insecure_channel(target, options=opts)
        else:
            channel = grpc.aio.secure_channel(target, credentials, options=opts)
        self._init(channel, target, timeout, metadata)

    @classmethod
    def from_channel(cls, channel: grpc.aio.Channel, *, timeout: Timeout = None,
                     metadata: Metadata = ()) -> "Client":
        """A client on a ``grpc.aio`` channel you made."""
        client = cls.__new__(cls)
        client._init(channel, "", timeout, metadata)
        return client

    def _init(self, channel: grpc.aio.Channel, target: str, timeout: Timeout,
              metadata: Metadata) -> None:
        self.target = target
        self._channel = channel
        self._stub = attention_pb2_grpc.AttentionServiceStub(channel)
        self._timeout = timeout
        self._metadata = tuple(metadata)
        self._health, self._health_request = _services.health_check(channel)
        self._index, self._index_request = _services.repository_index(channel)
        self._load, self._load_request = _services.repository_model_load(channel)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def _call(self, rpc: str, method: Callable[..., Any], request: Any, timeout: Any,
                    metadata: Metadata) -> Any:
        try:
            return await method(
                request, timeout=self._timeout if timeout is _UNSET else timeout,
                metadata=self._metadata + tuple(metadata) or None)
        except grpc.RpcError as error:
            raise Error.from_rpc_error(error, rpc) from error

    async def masked_softmax(self, x: ArrayLike, valid_lens: Optional[LengthsLike] = None,
                             *, timeout: Timeout = _UNSET,
                             metadata: Metadata = ()) -> Result:
        """x (B, Q, K), valid_lens None, (B,) or (B, Q) -> output (B, Q, K)."""
        request = _wire.masked_softmax(x, valid_lens)
        return _wire.result(await self._call("MaskedSoftmax", self._stub.MaskedSoftmax,
                                             request, timeout, metadata))

    async def batch_matmul(self, a: ArrayLike, b: ArrayLike, *,
                           precision: Precision = "float32", timeout: Timeout = _UNSET,
                           metadata: Metadata = ()) -> Result:
        """a (n, m, k) @ b (n, k, p) -> output (n, m, p)."""
        request = _wire.batch_matmul(a, b, precision)
        return _wire.result(await self._call("BatchMatmul", self._stub.BatchMatmul,
                                             request, timeout, metadata))

    async def scaled_dot_product_attention(
            self, queries: ArrayLike, keys: Optional[ArrayLike] = None,
            values: Optional[ArrayLike] = None,
            valid_lens: Optional[LengthsLike] = None, *, causal: bool = False,
            scale: Optional[float] = None, score: str = "dot_product",
            return_weights: bool = False, precision: Precision = "float32",
            memory_name: Optional[str] = None,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """queries (B, [H,] Lq, d), keys (B, [H,] Lk, d), values (B, [H,] Lk, v),
        valid_lens None, (B,) or (B, Lq) -> output (B, [H,] Lq, v), weights
        (B, [H,] Lq, Lk) when return_weights; or queries (B, Lq, d) and
        memory_name, a stored attention_memory model's keys and values."""
        request = _wire.attention(queries, keys, values, valid_lens, causal, scale,
                                  score, return_weights, precision, memory_name)
        return _wire.attention_result(await self._call(
            "ScaledDotProductAttention", self._stub.ScaledDotProductAttention,
            request, timeout, metadata))

    async def additive_attention(
            self, queries: ArrayLike, keys: ArrayLike, values: ArrayLike,
            valid_lens: Optional[LengthsLike] = None, *,
            weights: Optional[WeightsLike] = None, weights_name: Optional[str] = None,
            return_weights: bool = False,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """queries (B, Lq, q), keys (B, Lk, k), values (B, Lk, v), weights
        (w_q (h, q), w_k (h, k), w_v (h,)) or weights_name -> output
        (B, Lq, v), weights (B, Lq, Lk) when return_weights."""
        request = _wire.additive_attention(queries, keys, values, valid_lens, weights,
                                           weights_name, return_weights)
        return _wire.attention_result(await self._call(
            "AdditiveAttention", self._stub.AdditiveAttention, request, timeout,
            metadata))

    async def nadaraya_watson(
            self, x_train: Optional[ArrayLike] = None, y_train: Optional[ArrayLike] = None,
            x_query: Optional[ArrayLike] = None, *,
            kernel: str = "gaussian", bandwidth: Optional[float] = None,
            return_weights: bool = False, model_name: Optional[str] = None,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """x_train (n,) or (n, dx), y_train (n,) or (n, dy), x_query (m,) or
        (m, dx) -> output (m,) or (m, dy), weights (m, n) when
        return_weights; or x_query and model_name, a fitted model holding
        its bandwidth and training set."""
        request = _wire.nadaraya_watson(x_train, y_train, x_query, kernel, bandwidth,
                                        return_weights, model_name)
        return _wire.attention_result(await self._call(
            "NadarayaWatson", self._stub.NadarayaWatson, request, timeout, metadata))

    async def fit_bandwidth(
            self, x_train: Optional[ArrayLike] = None,
            y_train: Optional[ArrayLike] = None, *,
            initial_bandwidth: Optional[float] = None,
            learning_rate: Optional[float] = None, epochs: Optional[int] = None,
            save_as: str = "", model_name: str = "",
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> FitResult:
        """x_train (n,) or (n, dx), y_train (n,) or (n, dy), or model_name
        (a refit on its stored set) -> bandwidth, loss_per_epoch (epochs,),
        final_loss."""
        request = _wire.fit_bandwidth(x_train, y_train, initial_bandwidth,
                                      learning_rate, epochs, save_as, model_name)
        return _wire.fit_result(await self._call(
            "FitBandwidth", self._stub.FitBandwidth, request, timeout, metadata))

    async def health(self, service: str = "", *, timeout: Timeout = _UNSET,
                     metadata: Metadata = ()) -> str:
        """"SERVING", "NOT_SERVING", ... (see ``attnserve.Client.health``)."""
        response = await self._call("Health.Check", self._health,
                                    self._health_request(service=service), timeout,
                                    metadata)
        return _services.serving_status_name(response)

    async def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Waits until the server answers SERVING; ``Error`` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: Optional[Error] = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._channel.channel_ready(), left)
                if await self.health(timeout=max(0.01, deadline - time.monotonic())) \
                        == "SERVING":
                    return
            except asyncio.TimeoutError:
                break
            except Error as error:
                last = error
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        raise last or Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"not SERVING within {timeout} s", "Health.Check")

    async def store_memory(self, name: str, keys: ArrayLike, values: ArrayLike, *,
                           score: str = "dot_product", scale: Optional[float] = None,
                           bfloat16: bool = False, timeout: Timeout = _UNSET,
                           metadata: Metadata = ()) -> None:
        """Stores an ``attention_memory`` model (see ``Client.store_memory``)."""
        request = _wire.memory_load(self._load_request, name, keys, values, score,
                                    scale, bfloat16)
        await self._call("RepositoryModelLoad", self._load, request, timeout, metadata)

    async def append_memory(self, name: str, keys: ArrayLike, values: ArrayLike, *,
                            create: bool = False, score: str = "dot_product",
                            scale: Optional[float] = None, bfloat16: bool = False,
                            max_rows: int = 0, timeout: Timeout = _UNSET,
                            metadata: Metadata = ()) -> Appended:
        """Appends rows to a stored model, durably (see
        ``Client.append_memory``)."""
        request = _wire.append_memory(name, keys, values, create, score, scale,
                                      bfloat16, max_rows)
        return _wire.appended(await self._call(
            "AppendMemory", self._stub.AppendMemory, request, timeout, metadata))

    async def evict_memory(self, name: str, *, oldest: int, timeout: Timeout = _UNSET,
                           metadata: Metadata = ()) -> Evicted:
        """Drops the oldest rows of a stored model, durably (see
        ``Client.evict_memory``)."""
        request = _wire.evict_memory(name, oldest)
        return _wire.evicted(await self._call(
            "EvictMemory", self._stub.EvictMemory, request, timeout, metadata))

    async def models(self, *, ready_only: bool = False, timeout: Timeout = _UNSET,
                     metadata: Metadata = ()) -> List[ModelInfo]:
        """The server's models (KServe RepositoryIndex)."""
        response = await self._call("RepositoryIndex", self._index,
                                    self._index_request(ready=ready_only), timeout,
                                    metadata)
        return [ModelInfo(m.name, m.version, m.state, m.reason) for m in response.models]
