"""numpy <-> attention.v1 messages, shared by the sync and async clients.

Requests carry every tensor as ``raw`` (little-endian float32 bytes) and ask
for ``TENSOR_ENCODING_RAW`` answers: no per-element parsing either way.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from ._types import (AdditiveWeights, Appended, AttentionResult, Error,
                     Evicted, ExecutionInfo, FitResult, Result, invalid)

try:
    from ._generated import attention_pb2 as pb
except ImportError as error:  # a source checkout that was never built
    raise ImportError(
        "attnserve's gRPC stubs are generated when the package is built: "
        "install it with `pip install ./client/python` (or `pip install -e "
        "./client/python`) instead of importing it from the source tree"
    ) from error

ArrayLike = Any  # anything np.asarray takes: arrays, lists, torch CPU tensors
LengthsLike = Union[Sequence[int], Sequence[Sequence[int]], np.ndarray]

RAW = pb.TENSOR_ENCODING_RAW
_F32 = np.dtype("<f4")
_INT32 = np.iinfo(np.int32)

_PRECISIONS = {"float32": pb.PRECISION_FLOAT32, "bfloat16": pb.PRECISION_BFLOAT16,
               "float16": pb.PRECISION_FLOAT16}
_SCORES = {"dot_product": pb.SCORE_DOT_PRODUCT, "gaussian": pb.SCORE_GAUSSIAN}
MEMORY_FILE = "file:weights.safetensors"
_KERNELS = {"gaussian": pb.REGRESSION_KERNEL_GAUSSIAN,
            "boxcar": pb.REGRESSION_KERNEL_BOXCAR,
            "constant": pb.REGRESSION_KERNEL_CONSTANT,
            "epanechnikov": pb.REGRESSION_KERNEL_EPANECHNIKOV}


def enum_value(name: str, value: Union[str, int], choices: Mapping[str, int]) -> Any:
    """A keyword's enum value: one of `choices` (any case, '-' for '_') or
    the proto's own number. (Any: the stubs type each enum as its own
    int NewType.)"""
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key in choices:
            return choices[key]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in choices.values():
            return int(value)
    raise invalid(f"{name}: {value!r} is not one of {', '.join(choices)}")


def to_tensor(name: str, array: ArrayLike) -> pb.Tensor:
    """Any real array (any float or integer dtype, any memory order) as a
    raw float32 Tensor. Values beyond float32's range are refused here, naming
    the element (the server would only see infinity)."""
    a = np.asarray(array)
    if a.dtype.kind in "cbOUSMmV" and not _is_custom_float(a.dtype):
        raise invalid(f"{name}: dtype {a.dtype} is not a real number type")
    try:
        with np.errstate(over="ignore"):  # overflow is reported below, by element
            f = np.asarray(a, dtype=_F32, order="C")
    except (TypeError, ValueError) as error:
        raise invalid(f"{name}: cannot convert dtype {a.dtype} to float32: {error}")
    if a.dtype.itemsize > 4 or a.dtype.kind in "iu":
        with np.errstate(invalid="ignore"):
            overflow = np.isinf(f) & np.isfinite(a)
        if overflow.any():
            index = int(np.flatnonzero(overflow)[0])
            raise invalid(f"{name}: element {index} ({float(a.ravel()[index]):g}) "
                          "is beyond float32's range")
    return pb.Tensor(shape=f.shape, raw=f.tobytes())


def _is_custom_float(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16 and friends (JAX, TensorFlow) are kind 'V'.
    return dtype.kind == "V" and dtype.names is None and dtype.itemsize <= 8 and \
        np.can_cast(dtype, np.float32, casting="unsafe") and "float" in dtype.name


def to_lengths(lens: LengthsLike) -> pb.Lengths:
    """Valid lengths, (B,) or (B, Q), from a list or an integer array
    (floats with integral values are accepted)."""
    a = np.asarray(lens)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise invalid("valid_lens: lengths must be whole numbers")
    elif a.dtype.kind not in "iu":
        raise invalid(f"valid_lens: dtype {a.dtype} is not an integer type")
    if a.size and (a.min() < _INT32.min or a.max() > _INT32.max):
        raise invalid("valid_lens: a length is beyond int32")
    return pb.Lengths(shape=a.shape, values=a.astype(np.int32).ravel().tolist())


def from_tensor(tensor: pb.Tensor, what: str) -> np.ndarray:
    """A response tensor as a writable float32 array of its shape."""
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 0
    if tensor.raw:
        if len(tensor.raw) != 4 * count:
            raise _bad_response(f"{what}: raw holds {len(tensor.raw)} bytes for "
                                f"shape {shape}")
        data = np.frombuffer(tensor.raw, dtype=_F32).astype(np.float32)
    else:
        if len(tensor.values) != count:
            raise _bad_response(f"{what}: {len(tensor.values)} values for "
                                f"shape {shape}")
        data = np.asarray(tensor.values, dtype=np.float32)
    return data.reshape(shape)


def _bad_response(message: str) -> Error:
    return Error(grpc.StatusCode.INTERNAL, "malformed response: " + message)


def info(message: Any) -> ExecutionInfo:
    return ExecutionInfo(message.info.implementation, message.info.kernel_seconds,
                         message.info.queue_seconds)


# --------------------------------------------------------------------------
# Requests. Each builder takes the client method's arguments.


def masked_softmax(x: ArrayLike, valid_lens: Optional[LengthsLike]) -> pb.MaskedSoftmaxRequest:
    request = pb.MaskedSoftmaxRequest(x=to_tensor("x", x), output_encoding=RAW)
    if valid_lens is not None:
        request.valid_lens.CopyFrom(to_lengths(valid_lens))
    return request


def batch_matmul(a: ArrayLike, b: ArrayLike, precision: Union[str, int]) -> pb.BatchMatmulRequest:
    return pb.BatchMatmulRequest(
        a=to_tensor("a", a), b=to_tensor("b", b),
        precision=enum_value("precision", precision, _PRECISIONS),
        output_encoding=RAW)


def attention(queries: ArrayLike, keys: Optional[ArrayLike], values: Optional[ArrayLike],
              valid_lens: Optional[LengthsLike], causal: bool,
              scale: Optional[float], score: Union[str, int],
              return_weights: bool, precision: Union[str, int],
              memory_name: Optional[str] = None) -> pb.AttentionRequest:
    if memory_name is None and (keys is None or values is None):
        raise invalid("scaled_dot_product_attention: give `keys` and `values`, "
                      "or `memory_name`")
    if memory_name is not None and (keys is not None or values is not None):
        raise invalid(f"scaled_dot_product_attention: memory '{memory_name}' "
                      "holds the keys and values; leave `keys` and `values` out")
    request = pb.AttentionRequest(
        queries=to_tensor("queries", queries), causal=bool(causal),
        score=enum_value("score", score, _SCORES),
        return_weights=bool(return_weights),
        precision=enum_value("precision", precision, _PRECISIONS),
        output_encoding=RAW)
    if memory_name is not None:
        request.memory_name = memory_name
    else:
        request.keys.CopyFrom(to_tensor("keys", keys))
        request.values.CopyFrom(to_tensor("values", values))
    if valid_lens is not None:
        request.valid_lens.CopyFrom(to_lengths(valid_lens))
    if scale is not None:
        request.scale = float(scale)
    return request


WeightsLike = Union[AdditiveWeights, Tuple[ArrayLike, ArrayLike, ArrayLike],
                    Mapping[str, ArrayLike]]


def additive_attention(queries: ArrayLike, keys: ArrayLike, values: ArrayLike,
                       valid_lens: Optional[LengthsLike],
                       weights: Optional[WeightsLike], weights_name: Optional[str],
                       return_weights: bool) -> pb.AdditiveAttentionRequest:
    request = pb.AdditiveAttentionRequest(
        queries=to_tensor("queries", queries), keys=to_tensor("keys", keys),
        values=to_tensor("values", values), return_weights=bool(return_weights),
        output_encoding=RAW)
    if (weights is None) == (weights_name is None):
        raise invalid("additive_attention: give exactly one of `weights` "
                      "(w_q, w_k, w_v) and `weights_name`")
    if weights_name is not None:
        request.weights_name = weights_name
    elif weights is not None:
        if isinstance(weights, Mapping):
            missing = {"w_q", "w_k", "w_v"} - set(weights)
            if missing:
                raise invalid(f"weights: missing {', '.join(sorted(missing))}")
            w_q, w_k, w_v = weights["w_q"], weights["w_k"], weights["w_v"]
        elif isinstance(weights, AdditiveWeights):
            w_q, w_k, w_v = weights.w_q, weights.w_k, weights.w_v
        else:
            try:
                w_q, w_k, w_v = weights
            except (TypeError, ValueError):
                raise invalid("weights: expected (w_q, w_k, w_v), a mapping "
                              "with those keys or an AdditiveWeights") from None
        request.weights.CopyFrom(pb.AdditiveWeights(
            w_q=to_tensor("weights.w_q", w_q), w_k=to_tensor("weights.w_k", w_k),
            w_v=to_tensor("weights.w_v", w_v)))
    if valid_lens is not None:
        request.valid_lens.CopyFrom(to_lengths(valid_lens))
    return request


def nadaraya_watson(x_train: Optional[ArrayLike], y_train: Optional[ArrayLike],
                    x_query: Optional[ArrayLike], kernel: Union[str, int],
                    bandwidth: Optional[float], return_weights: bool,
                    model_name: Optional[str] = None) -> pb.NadarayaWatsonRequest:
    if x_query is None:
        raise invalid("nadaraya_watson: `x_query` is required")
    if model_name is None and (x_train is None or y_train is None):
        raise invalid("nadaraya_watson: give `x_train` and `y_train`, or "
                      "`model_name` (a fitted model that holds them)")
    request = pb.NadarayaWatsonRequest(
        x_query=to_tensor("x_query", x_query),
        kernel=enum_value("kernel", kernel, _KERNELS),
        return_weights=bool(return_weights), output_encoding=RAW)
    if x_train is not None:
        request.x_train.CopyFrom(to_tensor("x_train", x_train))
    if y_train is not None:
        request.y_train.CopyFrom(to_tensor("y_train", y_train))
    if model_name is not None:
        request.model_name = model_name
    if bandwidth is not None:
        request.bandwidth = float(bandwidth)
    return request


def fit_bandwidth(x_train: Optional[ArrayLike], y_train: Optional[ArrayLike],
                  initial_bandwidth: Optional[float], learning_rate: Optional[float],
                  epochs: Optional[int], save_as: str,
                  model_name: str = "") -> pb.FitBandwidthRequest:
    if model_name:
        if x_train is not None or y_train is not None:
            raise invalid("fit_bandwidth: model_name fits the model's own training "
                          "set: leave x_train and y_train out")
        request = pb.FitBandwidthRequest(model_name=model_name, save_as=save_as or "")
    elif x_train is None or y_train is None:
        raise invalid("fit_bandwidth: needs x_train and y_train, or `model_name`")
    else:
        request = pb.FitBandwidthRequest(x_train=to_tensor("x_train", x_train),
                                         y_train=to_tensor("y_train", y_train),
                                         save_as=save_as or "")
    if initial_bandwidth is not None:
        request.initial_bandwidth = float(initial_bandwidth)
    if learning_rate is not None:
        request.learning_rate = float(learning_rate)
    if epochs is not None:
        if isinstance(epochs, bool) or int(epochs) != epochs or not \
                _INT32.min <= int(epochs) <= _INT32.max:
            raise invalid(f"epochs: {epochs!r} is not an int32")
        request.epochs = int(epochs)
    return request


def append_memory(name: str, keys: ArrayLike, values: ArrayLike, create: bool,
                  score: str, scale: Optional[float], bfloat16: bool,
                  max_rows: int) -> pb.AppendMemoryRequest:
    request = pb.AppendMemoryRequest(name=name, keys=to_tensor("keys", keys),
                                     values=to_tensor("values", values))
    if create:
        request.create.score = enum_value("score", score, _SCORES)
        request.create.precision = (pb.PRECISION_BFLOAT16 if bfloat16
                                    else pb.PRECISION_FLOAT32)
        if scale is not None:
            request.create.scale = float(scale)
        if isinstance(max_rows, bool) or int(max_rows) != max_rows or max_rows < 0:
            raise invalid(f"max_rows: {max_rows!r} is not a count (0: no window)")
        request.create.max_rows = int(max_rows)
    elif score != "dot_product" or scale is not None or bfloat16 or max_rows:
        raise invalid("append_memory: score, scale, bfloat16 and max_rows make "
                      "a new memory: pass create=True with them")
    return request


def evict_memory(name: str, oldest: int) -> pb.EvictMemoryRequest:
    if isinstance(oldest, bool) or int(oldest) != oldest:
        raise invalid(f"oldest: {oldest!r} is not an integer")
    return pb.EvictMemoryRequest(name=name, oldest=int(oldest))


# --------------------------------------------------------------------------
# Responses.


def result(response: Any) -> Result:
    return Result(from_tensor(response.output, "output"), info(response))


def attention_result(response: Any) -> AttentionResult:
    weights = (from_tensor(response.weights, "weights")
               if response.HasField("weights") else None)
    return AttentionResult(from_tensor(response.output, "output"), weights,
                           info(response))


def fit_result(response: pb.FitBandwidthResponse) -> FitResult:
    return FitResult(float(response.bandwidth),
                     np.asarray(response.loss_per_epoch, dtype=np.float64),
                     float(response.final_loss), info(response))


def appended(response: pb.AppendMemoryResponse) -> Appended:
    return Appended(int(response.first_row), int(response.rows), int(response.files),
                    int(response.evicted))


def evicted(response: pb.EvictMemoryResponse) -> Evicted:
    return Evicted(int(response.evicted), int(response.rows))


def _bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (as the server's
    BF16 memories are read)."""
    bits = array.astype(_F32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def memory_load(request_class: Any, name: str, keys: ArrayLike, values: ArrayLike,
                score: str, scale: Optional[float], bfloat16: bool) -> Any:
    """A KServe RepositoryModelLoadRequest (`request_class`) uploading an
    ``attention_memory`` model: its config as JSON and its
    weights.safetensors bytes (keys [N, d], values [N, v])."""
    k, v = np.asarray(keys), np.asarray(values)
    if k.ndim != 2 or v.ndim != 2 or k.shape[0] != v.shape[0] or k.shape[0] == 0:
        raise invalid(f"store_memory: keys {tuple(k.shape)} and values "
                      f"{tuple(v.shape)} must be (N, d) and (N, v), N >= 1")
    if score not in _SCORES:
        raise invalid(f"store_memory: score '{score}' is not one of "
                      f"{sorted(_SCORES)}")
    header, blobs, offset = {}, [], 0
    for tensor_name, array in (("keys", k), ("values", v)):
        blob = (_bfloat16_bits(array) if bfloat16
                else np.ascontiguousarray(array, _F32)).tobytes()
        header[tensor_name] = {"dtype": "BF16" if bfloat16 else "F32",
                               "shape": list(array.shape),
                               "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned
    weights = struct.pack("<Q", len(text)) + text + b"".join(blobs)
    parameters = {"score": {"string_value": score}}
    if scale is not None:
        parameters["scale"] = {"string_value": repr(float(scale))}
    request = request_class(model_name=name)
    request.parameters["config"].string_param = json.dumps(
        {"name": name, "backend": "attention_memory", "parameters": parameters})
    request.parameters[MEMORY_FILE].bytes_param = weights
    return request
