"""The blocking client: ``attnserve.Client``."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import grpc

from . import _services, _wire
from ._generated import attention_pb2_grpc
from ._types import (Appended, AttentionResult, Error, Evicted, FitResult, ModelInfo,
                     Result)
from ._wire import ArrayLike, LengthsLike, WeightsLike

#: The server's default ``--max_message_bytes`` (two 4096 x 4096 float32
#: tensors); the client sends and receives up to the same by default.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20

Metadata = Sequence[Tuple[str, Union[str, bytes]]]
Timeout = Optional[float]
Precision = str  # "float32" | "bfloat16" | "float16"
_UNSET: Any = object()


def channel_options(max_message_bytes: int,
                    options: Sequence[Tuple[str, Any]] = ()) -> List[Tuple[str, Any]]:
    """Message size limits first; `options` may override them or add any
    gRPC channel argument (keepalive, service config, ...)."""
    merged = {"grpc.max_send_message_length": max_message_bytes,
              "grpc.max_receive_message_length": max_message_bytes}
    merged.update(dict(options))
    return list(merged.items())


class Client:
    """A blocking client of attnserve's typed API (attention.v1).

    Thread-safe: one client (one gRPC channel, connected lazily) can be
    shared by any number of threads. Every call takes numpy arrays (any real
    dtype, C or Fortran order; they travel as raw float32), returns numpy
    float32 arrays in a small dataclass, and raises ``attnserve.Error``
    (``.code`` is the gRPC status code) on any failure.

    Args:
        target: ``"host:port"`` (any gRPC target, e.g. ``"dns:///svc:8001"``).
        timeout: default deadline of every call in seconds (None: none);
            each method's ``timeout=`` overrides it.
        credentials: ``grpc.ChannelCredentials`` for TLS (e.g.
            ``grpc.ssl_channel_credentials(root_certs)``, or composed with
            ``grpc.access_token_call_credentials(token)`` for a bearer
            token); None is a plaintext channel. attnserve serves plaintext
            today; this is where TLS and tokens plug in once it has them.
        metadata: (key, value) pairs sent with every call (e.g. an
            ``("authorization", "Bearer ...")`` header for a proxy in front of
            the server); each method's ``metadata=`` is added to it.
        max_message_bytes: largest message sent or received; the default is
            the server's default ``--max_message_bytes`` (256 MiB).
        options: more gRPC channel arguments, e.g.
            ``[("grpc.keepalive_time_ms", 30000)]``.
    """

    def __init__(self, target: str, *, timeout: Timeout = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 metadata: Metadata = (),
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        opts = channel_options(max_message_bytes, options)
        if credentials is None:
            channel = grpc.insecure_channel(target, options=opts)
        else:
            channel = grpc.secure_channel(target, credentials, options=opts)
        self._init(channel, target, timeout, metadata)

    @classmethod
    def from_channel(cls, channel: grpc.Channel, *, timeout: Timeout = None,
                     metadata: Metadata = ()) -> "Client":
        """A client on a channel you made (interceptors, custom credentials).
        ``close()`` closes that channel."""
        client = cls.__new__(cls)
        client._init(channel, "", timeout, metadata)
        return client

    def _init(self, channel: grpc.Channel, target: str, timeout: Timeout,
              metadata: Metadata) -> None:
        self.target = target
        self._channel = channel
        self._stub = attention_pb2_grpc.AttentionServiceStub(channel)
        self._timeout = timeout
        self._metadata = tuple(metadata)
        self._health, self._health_request = _services.health_check(channel)
        self._index, self._index_request = _services.repository_index(channel)
        self._load, self._load_request = _services.repository_model_load(channel)

    # -- plumbing ----------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _call(self, rpc: str, method: Callable[..., Any], request: Any, timeout: Any,
              metadata: Metadata) -> Any:
        try:
            return method(request,
                          timeout=self._timeout if timeout is _UNSET else timeout,
                          metadata=self._metadata + tuple(metadata) or None)
        except grpc.RpcError as error:
            raise Error.from_rpc_error(error, rpc) from error

    # -- the typed API -----------------------------------------------------

    def masked_softmax(self, x: ArrayLike, valid_lens: Optional[LengthsLike] = None, *,
                       timeout: Timeout = _UNSET, metadata: Metadata = ()) -> Result:
        """Softmax over the last axis of x, masked by valid lengths.

        Args:
            x: (B, Q, K) scores.
            valid_lens: None (no mask), (B,) (one length per batch item) or
                (B, Q) (one per row); each in [0, K]. Positions at or beyond
                a row's length get exactly 0; a length of 0 gives a zero row.

        Returns:
            ``Result``: ``output`` (B, Q, K) float32.
        """
        request = _wire.masked_softmax(x, valid_lens)
        return _wire.result(self._call("MaskedSoftmax", self._stub.MaskedSoftmax,
                                       request, timeout, metadata))

    def batch_matmul(self, a: ArrayLike, b: ArrayLike, *, precision: Precision = "float32",
                     timeout: Timeout = _UNSET, metadata: Metadata = ()) -> Result:
        """Batched matrix product a @ b.

        Args:
            a: (n, m, k). b: (n, k, p).
            precision: "float32", or "bfloat16" / "float16" products with
                float32 accumulation.

        Returns:
            ``Result``: ``output`` (n, m, p) float32.
        """
        request = _wire.batch_matmul(a, b, precision)
        return _wire.result(self._call("BatchMatmul", self._stub.BatchMatmul,
                                       request, timeout, metadata))

    def scaled_dot_product_attention(
            self, queries: ArrayLike, keys: Optional[ArrayLike] = None,
            values: Optional[ArrayLike] = None,
            valid_lens: Optional[LengthsLike] = None, *, causal: bool = False,
            scale: Optional[float] = None, score: str = "dot_product",
            return_weights: bool = False, precision: Precision = "float32",
            memory_name: Optional[str] = None,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """softmax(scale * Q K^T, masked) V, single- or multi-head.

        Args:
            queries: (B, Lq, d), or (B, H, Lq, d) for H heads.
            keys: (B, Lk, d) or (B, H, Lk, d).
            values: (B, Lk, v) or (B, H, Lk, v).
            memory_name: instead of keys and values, a model of the server's
                repository with backend ``attention_memory``: its keys (N, d),
                values (N, v), score and scale answer the (B, Lq, d) queries
                (leave keys, values, valid_lens, causal, scale and score
                unset; NOT_FOUND if there is none of that name).
            valid_lens: None, (B,) or (B, Lq); applies to every head.
            causal: query row i attends to keys j <= i (top-left aligned).
            scale: default 1/sqrt(d) for "dot_product", 1 for "gaussian".
            score: "dot_product" (q.k) or "gaussian" (-||q - k||^2 / 2).
            return_weights: also return the (B, [H,] Lq, Lk) weights.
            precision: "float32", "bfloat16" or "float16" products.

        Returns:
            ``AttentionResult``: ``output`` (B, [H,] Lq, v), ``weights`` or
            None.
        """
        request = _wire.attention(queries, keys, values, valid_lens, causal, scale,
                                  score, return_weights, precision, memory_name)
        return _wire.attention_result(self._call(
            "ScaledDotProductAttention", self._stub.ScaledDotProductAttention,
            request, timeout, metadata))

    def additive_attention(
            self, queries: ArrayLike, keys: ArrayLike, values: ArrayLike,
            valid_lens: Optional[LengthsLike] = None, *,
            weights: Optional[WeightsLike] = None, weights_name: Optional[str] = None,
            return_weights: bool = False,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """Additive (MLP) attention: score(q, k) = w_v . tanh(W_q q + W_k k).

        Args:
            queries: (B, Lq, q). keys: (B, Lk, k). values: (B, Lk, v).
            valid_lens: None, (B,) or (B, Lq).
            weights: the scoring parameters inline: ``(w_q, w_k, w_v)`` with
                w_q (h, q), w_k (h, k), w_v (h,), a mapping with those keys,
                or an ``AdditiveWeights``.
            weights_name: instead of ``weights``, a model of the server's
                repository with backend ``additive_attention`` (NOT_FOUND if
                there is none of that name). Exactly one of the two.
            return_weights: also return the (B, Lq, Lk) weights.

        Returns:
            ``AttentionResult``: ``output`` (B, Lq, v), ``weights`` or None.
        """
        request = _wire.additive_attention(queries, keys, values, valid_lens, weights,
                                           weights_name, return_weights)
        return _wire.attention_result(self._call(
            "AdditiveAttention", self._stub.AdditiveAttention, request, timeout,
            metadata))

    def nadaraya_watson(
            self, x_train: Optional[ArrayLike] = None, y_train: Optional[ArrayLike] = None,
            x_query: Optional[ArrayLike] = None, *,
            kernel: str = "gaussian", bandwidth: Optional[float] = None,
            return_weights: bool = False, model_name: Optional[str] = None,
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> AttentionResult:
        """Nadaraya-Watson kernel regression: each query's prediction is the
        kernel-weighted mean of y_train, with u = bandwidth * ||x - x_i||.

        Args:
            x_train: (n,) or (n, dx). y_train: (n,) or (n, dy).
            x_query: (m,) or (m, dx); required.
            model_name: a fitted model of the server's repository (``save_as``
                of ``fit_bandwidth`` saves one): its bandwidth, and the
                training set it holds, answer ``x_query`` alone, the
                textbook's ``net(x_test, keys, values)``. Leave bandwidth
                (and x_train, y_train) unset.
            kernel: "gaussian" (exp(-u^2/2), normalised as a softmax),
                "boxcar" ([u < 1]), "constant" (1), "epanechnikov"
                (max(0, 1 - u)).
            bandwidth: w; None means 1, the nonparametric estimate.
            return_weights: also return the (m, n) weights.

        Returns:
            ``AttentionResult``: ``output`` (m,) or (m, dy), ``weights`` or
            None.
        """
        request = _wire.nadaraya_watson(x_train, y_train, x_query, kernel, bandwidth,
                                        return_weights, model_name)
        return _wire.attention_result(self._call(
            "NadarayaWatson", self._stub.NadarayaWatson, request, timeout, metadata))

    def fit_bandwidth(
            self, x_train: Optional[ArrayLike] = None,
            y_train: Optional[ArrayLike] = None, *,
            initial_bandwidth: Optional[float] = None,
            learning_rate: Optional[float] = None, epochs: Optional[int] = None,
            save_as: str = "", model_name: str = "",
            timeout: Timeout = _UNSET, metadata: Metadata = ()) -> FitResult:
        """Fits the Gaussian Nadaraya-Watson bandwidth w on the server by
        full-batch gradient descent on sum_i (yhat_i - y_i)^2, each yhat_i
        attending over every training point but i (the textbook's fit).

        Args:
            x_train: (n,) or (n, dx), n >= 2. y_train: (n,) or (n, dy).
            initial_bandwidth: default 1. learning_rate: default 0.5.
            epochs: default 5, at most 100000.
            save_as: when set, the server saves the fitted model, with its
                training set, into its repository under this name and serves
                it at once: ``nadaraya_watson(x_query=..., model_name=...)``
                then answers queries alone.
            model_name: instead of x_train and y_train, a stored model
                holding its training set (saved by ``save_as``, grown by
                ``append_memory``): the fit runs on that set and its
                bandwidth replaces the model's (the save_as permission).

        Returns:
            ``FitResult``: ``bandwidth``, ``loss_per_epoch`` (epochs,),
            ``final_loss``.
        """
        request = _wire.fit_bandwidth(x_train, y_train, initial_bandwidth,
                                      learning_rate, epochs, save_as, model_name)
        return _wire.fit_result(self._call("FitBandwidth", self._stub.FitBandwidth,
                                           request, timeout, metadata))

    # -- health and models -------------------------------------------------

    def health(self, service: str = "", *, timeout: Timeout = _UNSET,
               metadata: Metadata = ()) -> str:
        """The standard gRPC health check: "SERVING", or "NOT_SERVING" while
        the server warms up or drains. ``service`` "" is the whole server;
        "attention.v1.AttentionService" the typed API (NOT_FOUND for names
        the server does not know)."""
        response = self._call("Health.Check", self._health,
                              self._health_request(service=service), timeout, metadata)
        return _services.serving_status_name(response)

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Blocks until the server answers SERVING (polling the health check
        while it starts); raises ``Error`` (DEADLINE_EXCEEDED, or the last
        call's code) when it does not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: Optional[Error] = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                grpc.channel_ready_future(self._channel).result(timeout=left)
                if self.health(timeout=max(0.01, deadline - time.monotonic())) == "SERVING":
                    return
            except grpc.FutureTimeoutError:
                break
            except Error as error:
                last = error
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        raise last or Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"not SERVING within {timeout} s", "Health.Check")

    def store_memory(self, name: str, keys: ArrayLike, values: ArrayLike, *,
                     score: str = "dot_product", scale: Optional[float] = None,
                     bfloat16: bool = False, timeout: Timeout = _UNSET,
                     metadata: Metadata = ()) -> None:
        """Stores keys (N, d) and values (N, v) on the server as the
        ``attention_memory`` model ``name``, which queries then name:
        ``scaled_dot_product_attention(queries, memory_name=name)``. Sent
        whole in one KServe RepositoryModelLoad (Triton's model_repository
        extension, as ``tritonclient``'s ``load_model(name, config=...,
        files=...)`` sends it); the server must run with
        ``--model_control_mode=explicit``. A model of that name is replaced
        whole, and a refused one leaves it as it was.

        Args:
            score: "dot_product" (scale * q . k) or "gaussian"
                (scale * -||q - k||^2 / 2).
            scale: None: 1/sqrt(d) for the dot product, 1 for the Gaussian.
            bfloat16: store the memory as BF16 (half the bytes to read;
                its calls compute in bfloat16).
        """
        request = _wire.memory_load(self._load_request, name, keys, values, score,
                                    scale, bfloat16)
        self._call("RepositoryModelLoad", self._load, request, timeout, metadata)

    def append_memory(self, name: str, keys: ArrayLike, values: ArrayLike, *,
                      create: bool = False, score: str = "dot_product",
                      scale: Optional[float] = None, bfloat16: bool = False,
                      max_rows: int = 0, timeout: Timeout = _UNSET,
                      metadata: Metadata = ()) -> Appended:
        """Appends rows to the stored model ``name`` while it serves: an
        ``attention_memory``'s keys (n, d) and values (n, v), or a
        ``nadaraya_watson`` model's training set (x rows as ``keys``, (n,)
        or (n, dx); y rows as ``values``). The rows are on the server's
        disk (fsynced) before this returns, and every call that starts after
        it sees them; the memory's earlier rows keep their indices (unless
        its window drops some), the new ones follow
        (``Appended.first_row``). No message carries the whole
        memory, so it can grow past what one upload could hold.

        Args:
            create: make the memory from these rows when ``name`` does not
                exist yet, with ``score``, ``scale`` (None: 1/sqrt(d) for
                the dot product, 1 for the Gaussian), ``bfloat16`` (store
                the rows rounded) and ``max_rows`` (keep the newest that
                many, each append dropping the oldest beyond them:
                ``Appended.evicted``; 0: keep all); a memory that exists
                must have the same settings. Without it, an unknown name
                is NOT_FOUND.

        Needs the token permission ``append`` (or ``model_control``) when
        the server checks tokens.
        """
        request = _wire.append_memory(name, keys, values, create, score, scale,
                                      bfloat16, max_rows)
        return _wire.appended(self._call("AppendMemory", self._stub.AppendMemory,
                                         request, timeout, metadata))

    def evict_memory(self, name: str, *, oldest: int, timeout: Timeout = _UNSET,
                     metadata: Metadata = ()) -> Evicted:
        """Drops the ``oldest`` rows of the stored model ``name`` (an
        ``attention_memory``'s or a training set's), durably, while it
        serves: row i becomes row i - oldest, in ``attention_weights``'
        columns too, for every call that starts after this returns. At
        least 1, and fewer than the model holds. The permission is
        ``append_memory``'s."""
        request = _wire.evict_memory(name, oldest)
        return _wire.evicted(self._call("EvictMemory", self._stub.EvictMemory,
                                        request, timeout, metadata))

    def models(self, *, ready_only: bool = False, timeout: Timeout = _UNSET,
               metadata: Metadata = ()) -> List[ModelInfo]:
        """The server's models (KServe RepositoryIndex): built-in ones and
        those of its model repository, e.g. ``additive_attention`` weights
        for ``weights_name`` and models saved by ``fit_bandwidth(save_as=)``.
        The typed API has no listing RPC of its own."""
        response = self._call("RepositoryIndex", self._index,
                              self._index_request(ready=ready_only), timeout, metadata)
        return [ModelInfo(m.name, m.version, m.state, m.reason) for m in response.models]
