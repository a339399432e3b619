"""The health and KServe messages, from a private descriptor pool.

``_generated/services.binpb`` (made at build time from proto/grpc/health and
proto/inference) is loaded into a pool of its own, not protobuf's default
one, so importing attnserve beside tritonclient or grpcio-health-checking
(which register the same message names from their own files) never clashes.
Only the few RPCs the client calls are wired up, as plain multi-callables.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, Callable, Tuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REPOSITORY_INDEX = "/inference.GRPCInferenceService/RepositoryIndex"
REPOSITORY_MODEL_LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"


@functools.lru_cache(maxsize=None)
def _pool() -> descriptor_pool.DescriptorPool:
    data = resources.files("attnserve._generated").joinpath(
        "services.binpb").read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    return pool


@functools.lru_cache(maxsize=None)
def message_class(full_name: str) -> Any:
    descriptor = _pool().FindMessageTypeByName(full_name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(_pool()).GetPrototype(descriptor)


def method(channel: Any, path: str, request: str,
           response: str) -> Tuple[Callable[..., Any], Any]:
    """A unary-unary multi-callable for `path` on `channel` (sync or aio),
    and the request message class."""
    request_class = message_class(request)
    response_class = message_class(response)
    return channel.unary_unary(path,
                               request_serializer=request_class.SerializeToString,
                               response_deserializer=response_class.FromString), request_class


def health_check(channel: Any) -> Tuple[Callable[..., Any], Any]:
    return method(channel, HEALTH_CHECK, "grpc.health.v1.HealthCheckRequest",
                  "grpc.health.v1.HealthCheckResponse")


def repository_index(channel: Any) -> Tuple[Callable[..., Any], Any]:
    return method(channel, REPOSITORY_INDEX, "inference.RepositoryIndexRequest",
                  "inference.RepositoryIndexResponse")


def repository_model_load(channel: Any) -> Tuple[Callable[..., Any], Any]:
    return method(channel, REPOSITORY_MODEL_LOAD, "inference.RepositoryModelLoadRequest",
                  "inference.RepositoryModelLoadResponse")


def serving_status_name(response: Any) -> str:
    """"SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"."""
    field = response.DESCRIPTOR.fields_by_name["status"]
    return str(field.enum_type.values_by_number[response.status].name)
