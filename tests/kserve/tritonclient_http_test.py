"""attnserve's KServe v2 HTTP/REST API, driven by the real tritonclient.http.

The REST twin of tritonclient_test.py (the gRPC test): every endpoint the
REST front end serves (server/kserve/rest_service.h) through
tritonclient.http's InferenceServerClient, as any Triton user would call
it, and the protocol's edges through raw http.client requests and curl.

- Every model, and in the "repository" mode the repository's models, with
  JSON data (binary_data=False on inputs and outputs) and with binary data
  (Triton's binary tensor data extension, the client's default), each output
  requested, against the float64 reference of tritonclient_test.py within
  its bounds; the JSON result must equal the same request's binary result
  bit for bit (FP32 round-trips exactly through the JSON text).
- Health, server and model metadata, model config, readiness, statistics,
  the repository index and (mode "repository") model load and unload, each
  compared with what tritonclient.grpc says over the gRPC port for the same
  call where both carry the same message.
- Errors: the HTTP status (google.rpc's mapping, kserve_rest.h HttpStatusOf)
  and an {"error": "..."} body that tritonclient reads and that names the
  field at fault.
- curl lines like the README's (CURL_LINES), run as they are written (the README's own are run by tests/e2e/http_defences.py).

Environment: ATTNSERVE_HTTP_PORT (the REST port, required),
ATTNSERVE_TARGET (host:port of the gRPC port, required), ATTNSERVE_MODE,
ATTNSERVE_REPOSITORY and ATTNSERVE_TEST_SEED as for tritonclient_test.py,
whose reference and helpers this imports (so the typed API's stubs must be
on PYTHONPATH as for it); run_tritonclient_http_test.sh sets all of them up.
Plain unittest; the last line printed is "N passed, M failed".
"""

import http.client
import json
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

# The float64 reference, its bounds and the assertion helpers: those of the
# gRPC test, imported (importing it runs nothing; it needs the typed API's
# stubs on PYTHONPATH, which the runner generates).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tritonclient_test as grpc_test  # noqa: E402
from tritonclient_test import (  # noqa: E402
    MODEL_SIGNATURES, MODELS, OUT_ATOL, OUT_RTOL, attention_ref,
    batch_matmul_ref, f64, masked_softmax_ref, nadaraya_watson_ref,
    read_safetensors)

HTTP_PORT = int(os.environ.get("ATTNSERVE_HTTP_PORT", "8000"))
HTTP_URL = f"127.0.0.1:{HTTP_PORT}"
TARGET = os.environ.get("ATTNSERVE_TARGET", "127.0.0.1:8001")
MODE = os.environ.get("ATTNSERVE_MODE", "plain")
SEED = int(os.environ.get("ATTNSERVE_TEST_SEED", "20240611"))
REPOSITORY = os.environ.get("ATTNSERVE_REPOSITORY", "")
DEADLINE_S = 20.0
# The runner starts the server with --max_message_bytes=1048576.
MAX_MESSAGE_BYTES = 1 << 20

# curl lines like the README's; PORT stands for the HTTP port (8000 by default).
# The last one: a query against three keys of which the first two count.
CURL_LINES = [
    "curl -s localhost:PORT/v2/health/ready -o /dev/null -w '%{http_code}'",
    "curl -s localhost:PORT/v2/models/dot_product_attention",
    "curl -s localhost:PORT/v2/models/dot_product_attention/infer "
    "-H 'Content-Type: application/json' -d '"
    '{"inputs": ['
    '{"name": "queries", "shape": [1, 1, 2], "datatype": "FP32", '
    '"data": [[[1, 0]]]}, '
    '{"name": "keys", "shape": [1, 3, 2], "datatype": "FP32", '
    '"data": [[[1, 0], [0, 1], [1, 1]]]}, '
    '{"name": "values", "shape": [1, 3, 2], "datatype": "FP32", '
    '"data": [[[1, 2], [3, 4], [5, 6]]]}, '
    '{"name": "valid_lens", "shape": [1], "datatype": "INT32", '
    '"data": [2]}], '
    '"outputs": [{"name": "output"}, {"name": "attention_weights"}]}'
    "'",
]


# --------------------------------------------------------------------------
# Helpers.


def make_input(name, array, binary=True):
    """A tritonclient.http input: binary data (the client's default) or
    JSON `data`."""
    array = np.ascontiguousarray(array)
    tensor = httpclient.InferInput(name, list(array.shape),
                                   np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


class Raw:
    """One HTTP exchange over http.client: status, headers, body."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"HTTP {self.status}: {self.body[:300]!r}"


def raw_request(method, path, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", HTTP_PORT,
                                            timeout=DEADLINE_S)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Raw(response.status, response.headers, response.read())
    finally:
        connection.close()


def binary_request(inputs, outputs=None, parameters=None, json_size=None,
                   extra=b""):
    """A REST inference body with every input binary: (body, headers).

    `inputs`: [(name, array)]; `json_size` overrides the
    Inference-Header-Content-Length header; `extra` is appended."""
    header = {"inputs": [
        {"name": n, "shape": list(a.shape),
         "datatype": np_to_triton_dtype(a.dtype),
         "parameters": {"binary_data_size": a.nbytes}} for n, a in inputs]}
    if outputs is not None:
        header["outputs"] = outputs
    if parameters is not None:
        header["parameters"] = parameters
    text = json.dumps(header).encode()
    body = text + b"".join(np.ascontiguousarray(a).tobytes()
                           for _, a in inputs) + extra
    length = len(text) if json_size is None else json_size
    return body, {"Inference-Header-Content-Length": str(length),
                  "Content-Type": "application/octet-stream"}


def parse_binary_response(raw):
    """{output name: array} of a raw REST response, JSON or binary data."""
    length = raw.headers.get("Inference-Header-Content-Length")
    header = json.loads(raw.body if length is None else raw.body[:int(length)])
    arrays, offset = {}, 0 if length is None else int(length)
    for output in header["outputs"]:
        shape = output["shape"]
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            arrays[output["name"]] = np.frombuffer(
                raw.body[offset:offset + size], "<f4").reshape(shape)
            offset += size
        else:
            arrays[output["name"]] = np.array(output["data"],
                                              np.float32).reshape(shape)
    return header, arrays


def additive_attention_ref(w, queries, keys, values, valid_lens):
    """(output, weights, mask): w_v . tanh(W_q q + W_k k), masked softmax
    (tritonclient_test.py's reference, with its masked_softmax_ref)."""
    qf = f64(queries) @ f64(w["W_q"]).T
    kf = f64(keys) @ f64(w["W_k"]).T
    scores = np.tanh(qf[:, :, None, :] + kf[:, None, :, :]) @ f64(w["w_v"])
    weights, mask = masked_softmax_ref(scores, valid_lens)
    return weights @ f64(values), weights, mask


class HttpTestCase(grpc_test.KServeTestCase):
    """tritonclient_test.py's base (randn, assertClose, assertWeights) over
    tritonclient.http, with a gRPC client beside it to compare."""

    http = None
    grpc = None

    @classmethod
    def setUpClass(cls):
        cls.http = httpclient.InferenceServerClient(
            url=HTTP_URL, connection_timeout=DEADLINE_S,
            network_timeout=DEADLINE_S)
        cls.grpc = grpcclient.InferenceServerClient(url=TARGET)

    @classmethod
    def tearDownClass(cls):
        cls.http.close()
        cls.grpc.close()

    def infer(self, model, inputs, outputs=None, parameters=None,
              version="", binary=True, **kwargs):
        """Runs `model` on `inputs` ([(name, array)]) over HTTP.

        `outputs`: names to request (None requests none: tritonclient then
        asks for binary data); `binary`: binary data (True) or JSON `data`
        (False) for the inputs and requested outputs."""
        requested = None
        if outputs is not None:
            requested = [httpclient.InferRequestedOutput(n, binary_data=binary)
                         for n in outputs]
        return self.http.infer(
            model, [make_input(n, a, binary) for n, a in inputs],
            model_version=version, outputs=requested, parameters=parameters,
            **kwargs)

    def assertResponse(self, result, model, names, shapes, binary):
        """The response JSON: this model and version, exactly `names` in
        order, FP32, these shapes, each output as binary data of the right
        size or as JSON data of the right count."""
        response = result.get_response()
        how = "binary" if binary else "JSON"
        self.assertEqual(response["model_name"], model)
        self.assertEqual(response["model_version"], "1")
        outputs = response["outputs"]
        self.assertEqual([o["name"] for o in outputs], list(names),
                         f"{model} ({how}): output names/order")
        for output, shape in zip(outputs, shapes):
            name = output["name"]
            self.assertEqual(output["datatype"], "FP32", name)
            self.assertEqual(list(output["shape"]), list(shape),
                             f"{model} ({how}): {name} shape")
            count = int(np.prod(shape))
            if binary:
                self.assertNotIn("data", output, f"{name}: binary asked")
                self.assertEqual(output.get("parameters", {}).get(
                    "binary_data_size"), 4 * count,
                    f"{model}: {name} binary_data_size")
            else:
                self.assertNotIn("binary_data_size",
                                 output.get("parameters", {}),
                                 f"{name}: JSON asked")
                self.assertIn("data", output, f"{model}: {name} JSON data")
                self.assertEqual(len(output["data"]), count,
                                 f"{model}: {name} JSON data count")

    def run_both(self, model, inputs, names, shapes, check, parameters=None,
                 version=""):
        """Runs the request with binary data and with JSON data, each
        output requested by name (`names`, `shapes`): `check(got, how)` on
        each result ({name: float64 array}), then the two results must be
        equal bit for bit. Returns the binary result's arrays."""
        arrays = {}
        for binary in (True, False):
            how = "binary" if binary else "JSON"
            with self.subTest(data=how):
                result = self.infer(model, inputs, list(names),
                                    parameters=parameters, version=version,
                                    binary=binary)
                self.assertResponse(result, model, names, shapes, binary)
                arrays[how] = {n: result.as_numpy(n) for n in names}
                for n in names:
                    self.assertEqual(arrays[how][n].dtype, np.float32, n)
                check({n: a.astype(np.float64)
                       for n, a in arrays[how].items()}, how)
        if len(arrays) == 2:
            for n in names:
                a, b = arrays["binary"][n], arrays["JSON"][n]
                self.assertEqual(
                    a.tobytes(), b.tobytes(),
                    f"{model}: {n} read from JSON differs from the binary "
                    f"result: {np.count_nonzero(a != b)} elements, e.g. "
                    f"{b[a != b][:3]} vs {a[a != b][:3]}")
        return arrays.get("binary", {})

    def assertHttpError(self, call, status, names=()):
        """`call()` raises tritonclient's InferenceServerException with HTTP
        status `status` and a message (from the {"error": ...} body) naming
        each of `names` (a tuple inside: one of them)."""
        with self.assertRaises(InferenceServerException) as caught:
            call()
        error = caught.exception
        self.assertNotIn("exception occurred in the client", error.message(),
                         f"tritonclient could not read the error body: "
                         f"{error.message()}")
        self.assertEqual(error.status(), str(status),
                         f"HTTP {error.status()}: {error.message()}")
        self.assertNames(error.message(), names)
        return error.message()

    def assertNames(self, message, names):
        for name in names:
            alternatives = name if isinstance(name, tuple) else (name,)
            pattern = "|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])"
                               for n in alternatives)
            self.assertRegex(message, pattern,
                             f"the message does not name "
                             f"{' or '.join(alternatives)}")

    def assertRawError(self, raw, status, names=()):
        """A raw response: HTTP `status`, a JSON body {"error": "<message
        naming `names`>"}."""
        self.assertEqual(raw.status, status, raw)
        self.assertEqual(
            (raw.headers.get("Content-Type") or "").split(";")[0],
            "application/json", f"HTTP {raw.status}: Content-Type; {raw}")
        try:
            body = raw.json()
        except ValueError:
            self.fail(f"HTTP {raw.status}: the error body is not JSON "
                      f"({raw.headers.get('Content-Type')}): {raw.body[:200]!r}")
        self.assertIsInstance(body, dict, raw)
        self.assertEqual(list(body), ["error"], raw)
        self.assertIsInstance(body["error"], str, raw)
        self.assertNames(body["error"], names)
        return body["error"]


def as_proto(json_object, message):
    """The REST JSON parsed into `message` (strictly: an unknown field or a
    value of the wrong type is an error)."""
    return json_format.ParseDict(json_object, message)


# --- Server and model endpoints, against the gRPC port. ---------------------


class ServerEndpointTest(HttpTestCase):

    def test_server_live_and_ready(self):
        self.assertTrue(self.http.is_server_live())
        self.assertTrue(self.http.is_server_ready())
        for path in ("/v2/health/live", "/v2/health/ready"):
            raw = raw_request("GET", path)
            self.assertEqual(raw.status, 200, path)
            self.assertEqual(raw.body, b"", path)

    def test_server_metadata_as_grpc(self):
        metadata = self.http.get_server_metadata()
        self.assertEqual(metadata["name"], "attnserve")
        self.assertIn("model_configuration", metadata["extensions"])
        self.assertIn("statistics", metadata["extensions"])
        self.assertEqual(
            as_proto(metadata, service_pb2.ServerMetadataResponse()),
            self.grpc.get_server_metadata())

    def test_model_ready(self):
        for model in MODELS:
            self.assertTrue(self.http.is_model_ready(model), model)
            self.assertTrue(self.http.is_model_ready(model, "1"), model)
        for model, version in (("no_such_model", ""), ("masked_softmax", "2")):
            self.assertFalse(self.http.is_model_ready(model, version),
                             f"{model} version {version!r}")
        raw = raw_request("GET", "/v2/models/no_such_model/ready")
        self.assertRawError(raw, 404, ["no_such_model"])

    def test_model_metadata_as_grpc(self):
        models = list(MODEL_SIGNATURES)
        if REPOSITORY:
            models += repository_models()
        for model in models:
            with self.subTest(model=model):
                metadata = self.http.get_model_metadata(model)
                self.assertEqual(metadata["name"], model)
                self.assertEqual(metadata["versions"], ["1"])
                self.assertEqual(self.http.get_model_metadata(model, "1"),
                                 metadata)
                self.assertEqual(
                    as_proto(metadata, service_pb2.ModelMetadataResponse()),
                    self.grpc.get_model_metadata(model))
                if model not in MODEL_SIGNATURES:
                    continue
                inputs, outputs, _ = MODEL_SIGNATURES[model]
                for got, want in ((metadata["inputs"], inputs),
                                  (metadata["outputs"], outputs)):
                    by_name = {t["name"]: t for t in got}
                    self.assertEqual(sorted(by_name),
                                     sorted(n for n, _, _ in want))
                    for name, datatype, rank in want:
                        self.assertEqual(by_name[name]["datatype"], datatype)
                        shape = by_name[name]["shape"]
                        self.assertTrue(all(d == -1 for d in shape), shape)
                        if rank is not None:
                            self.assertEqual(len(shape), rank, name)

    def test_model_config_as_grpc(self):
        models = list(MODEL_SIGNATURES)
        if REPOSITORY:
            models += repository_models()
        for model in models:
            with self.subTest(model=model):
                config = self.http.get_model_config(model)
                self.assertEqual(config["name"], model)
                self.assertEqual(self.http.get_model_config(model, "1"),
                                 config)
                self.assertEqual(
                    as_proto(config, model_config_pb2.ModelConfig()),
                    self.grpc.get_model_config(model).config)
                if model in MODEL_SIGNATURES:
                    self.assertEqual(config.get("max_batch_size", 0),
                                     MODEL_SIGNATURES[model][2])
        config = self.http.get_model_config("dot_product_attention")
        self.assertEqual("dynamic_batching" in config, MODE == "batching",
                         f"mode {MODE}: dynamic_batching in config")

    def test_unknown_model_metadata_and_config(self):
        for call in (self.http.get_model_metadata, self.http.get_model_config):
            with self.subTest(call=call.__name__):
                self.assertHttpError(lambda: call("no_such_model"), 404,
                                     ["no_such_model"])
                self.assertHttpError(lambda: call("batch_matmul", "2"), 404,
                                     ["batch_matmul"])

    def test_repository_index_as_grpc(self):
        index = self.http.get_model_repository_index()
        self.assertIsInstance(index, list)
        expected = list(MODELS) + (repository_models() if REPOSITORY else [])
        self.assertEqual(sorted(m["name"] for m in index), sorted(expected))
        for model in index:
            self.assertEqual(model["state"], "READY", model)
            self.assertEqual(model["version"], "1", model)
        grpc_index = self.grpc.get_model_repository_index()
        self.assertEqual(
            [as_proto(m, service_pb2.RepositoryIndexResponse.ModelIndex())
             for m in index], list(grpc_index.models))
        # The body {"ready": true} (tritonclient does not send it) and an
        # empty body give the same list here: every model is ready.
        raw = raw_request("POST", "/v2/repository/index", b'{"ready": true}')
        self.assertEqual(raw.status, 200, raw)
        self.assertEqual(raw.json(), index)

    def test_statistics_count_calls_as_grpc(self):
        def stats():
            every = self.http.get_inference_statistics("batch_matmul")
            self.assertEqual(len(every["model_stats"]), 1)
            return every["model_stats"][0]

        before = stats()
        a, b = self.randn(2, 3, 4), self.randn(2, 4, 5)
        for binary in (True, False, True):
            self.infer("batch_matmul", [("X", a), ("Y", b)], ["Z"],
                       binary=binary)
        with self.assertRaises(InferenceServerException):
            self.infer("batch_matmul", [("X", a), ("Y", self.randn(2, 5, 5))])
        after = stats()
        self.assertEqual(after["name"], "batch_matmul")
        self.assertEqual(after["version"], "1")
        self.assertEqual(after["inference_count"] - before["inference_count"], 3)
        self.assertEqual(after["execution_count"] - before["execution_count"], 3)
        s0, s1 = before["inference_stats"], after["inference_stats"]
        self.assertEqual(s1["success"]["count"] - s0["success"]["count"], 3)
        self.assertGreater(s1["success"]["ns"], s0["success"]["ns"])
        self.assertEqual(s1["fail"]["count"] - s0["fail"]["count"], 1)
        self.assertEqual(
            s1["compute_infer"]["count"] - s0["compute_infer"]["count"], 3)
        self.assertGreater(after["last_inference"], 0)
        # The same numbers over gRPC (nothing ran in between), and by
        # version.
        self.assertEqual(
            as_proto({"model_stats": [after]},
                     service_pb2.ModelStatisticsResponse()),
            self.grpc.get_inference_statistics("batch_matmul"))
        self.assertEqual(
            self.http.get_inference_statistics("batch_matmul", "1")[
                "model_stats"], [after])
        # Every model at /v2/models/stats.
        every = self.http.get_inference_statistics()
        self.assertGreaterEqual({m["name"] for m in every["model_stats"]},
                                set(MODELS))
        self.assertEqual(
            as_proto(every, service_pb2.ModelStatisticsResponse()),
            self.grpc.get_inference_statistics())

    def test_percent_encoded_model_name(self):
        raw = raw_request("GET", "/v2/models/batch%5Fmatmul")
        self.assertEqual(raw.status, 200, raw)
        self.assertEqual(raw.json()["name"], "batch_matmul")


def repository_models():
    return sorted(name for name in os.listdir(REPOSITORY)
                  if os.path.isdir(os.path.join(REPOSITORY, name)))


# --- Every model, JSON and binary. ------------------------------------------


class MaskedSoftmaxTest(HttpTestCase):

    def run_case(self, x, valid_lens=None, lens_dtype=np.int32):
        inputs = [("X", x)]
        if valid_lens is not None:
            inputs.append(("valid_lens", np.asarray(valid_lens, lens_dtype)))
        want, mask = masked_softmax_ref(f64(x), valid_lens)
        self.run_both("masked_softmax", inputs, ["Y"], [x.shape],
                      lambda got, how: self.assertWeights(
                          got["Y"], want, mask, f"Y ({how})"))

    def test_textbook_lengths_per_batch(self):
        self.run_case(self.rng.random((2, 2, 4), dtype=np.float32), [2, 3])

    def test_textbook_lengths_per_row(self):
        self.run_case(self.rng.random((2, 2, 4), dtype=np.float32),
                      [[1, 3], [2, 4]])

    def test_no_lengths(self):
        self.run_case(3 * self.randn(3, 4, 7))

    def test_lengths_with_zero(self):
        self.run_case(self.randn(3, 2, 5), [0, 5, 2])
        self.run_case(self.randn(2, 3, 5), [[1, 0, 5], [3, 2, 0]])

    def test_int64_lengths(self):
        self.run_case(self.randn(2, 3, 5), [[1, 0, 5], [3, 2, 0]], np.int64)


class BatchMatmulTest(HttpTestCase):

    def test_textbook_ones(self):
        x, y = np.ones((2, 1, 4), np.float32), np.ones((2, 4, 6), np.float32)

        def check(got, how):
            np.testing.assert_array_equal(got["Z"], np.full((2, 1, 6), 4.0))
        self.run_both("batch_matmul", [("X", x), ("Y", y)], ["Z"],
                      [(2, 1, 6)], check)

    def test_random(self):
        for n, m, k, p in ((3, 5, 7, 4), (1, 1, 1, 1), (4, 16, 33, 9)):
            with self.subTest(shape=(n, m, k, p)):
                x, y = self.randn(n, m, k), self.randn(n, k, p)
                want = batch_matmul_ref(x, y)
                self.run_both("batch_matmul", [("X", x), ("Y", y)], ["Z"],
                              [(n, m, p)],
                              lambda got, how: self.assertClose(
                                  got["Z"], want, atol=1e-5, rtol=OUT_RTOL,
                                  what=f"Z ({how})"))

    def test_explicit_version(self):
        x, y = self.randn(2, 3, 4), self.randn(2, 4, 2)
        want = batch_matmul_ref(x, y)
        self.run_both("batch_matmul", [("X", x), ("Y", y)], ["Z"], [(2, 3, 2)],
                      lambda got, how: self.assertClose(
                          got["Z"], want, atol=1e-5, rtol=OUT_RTOL,
                          what=f"Z ({how})"), version="1")

    def test_extreme_floats_round_trip(self):
        # Values whose shortest decimal forms are long or use exponents:
        # the JSON result must still read back to the binary one exactly.
        x = np.array([[[1e-38, 3.4e38, 1.17549435e-38, 1e-45],
                       [0.1, 1 / 3, 16777217.0, -2.5e-7]]], np.float32)
        y = np.eye(4, dtype=np.float32)[None]

        def check(got, how):
            np.testing.assert_array_equal(got["Z"], f64(x))
        self.run_both("batch_matmul", [("X", x), ("Y", y)], ["Z"], [(1, 2, 4)],
                      check)


class DotProductAttentionTest(HttpTestCase):
    MODEL = "dot_product_attention"

    def inputs(self, q, k, v, valid_lens=None, lens_dtype=np.int32):
        inputs = [("queries", q), ("keys", k), ("values", v)]
        if valid_lens is not None:
            inputs.append(("valid_lens", np.asarray(valid_lens, lens_dtype)))
        return inputs

    def check(self, q, k, v, valid_lens=None,
              outputs=("output", "attention_weights"), lens_dtype=np.int32):
        B, Lq, _ = q.shape
        Lk, dv = v.shape[1], v.shape[2]
        shapes = {"output": (B, Lq, dv), "attention_weights": (B, Lq, Lk)}
        want_out, want_w, mask = attention_ref(q, k, v, valid_lens)

        def check(got, how):
            if "output" in got:
                self.assertClose(got["output"], want_out, atol=OUT_ATOL,
                                 rtol=OUT_RTOL, what=f"output ({how})")
                empty = ~mask.any(-1)
                self.assertTrue(np.all(got["output"][empty] == 0.0),
                                f"output rows of valid length 0 are not 0 "
                                f"({how})")
            if "attention_weights" in got:
                self.assertWeights(got["attention_weights"], want_w, mask,
                                   f"attention_weights ({how})")
        return self.run_both(self.MODEL,
                             self.inputs(q, k, v, valid_lens, lens_dtype),
                             list(outputs), [shapes[n] for n in outputs],
                             check)

    def test_textbook_toy(self):
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        w = self.check(q, k, v, [2, 6])["attention_weights"]
        self.assertTrue(np.all(w[0, 0, 2:] == 0.0), w[0, 0])
        self.assertTrue(np.all(w[1, 0, 6:] == 0.0), w[1, 0])
        self.assertTrue(np.all(w[0, 0, :2] > 0.0), w[0, 0])

    def test_no_lengths(self):
        self.check(self.randn(4, 6, 8), self.randn(4, 9, 8),
                   self.randn(4, 9, 5))

    def test_lengths_per_batch_int32(self):
        self.check(self.randn(3, 2, 4), self.randn(3, 7, 4),
                   self.randn(3, 7, 3), [0, 3, 7])

    def test_lengths_per_query_int32(self):
        self.check(self.randn(3, 4, 3), self.randn(3, 5, 3),
                   self.randn(3, 5, 2),
                   [[5, 0, 2, 1], [3, 3, 0, 5], [0, 0, 0, 0]])

    def test_lengths_per_batch_int64(self):
        self.check(self.randn(2, 1, 2), self.randn(2, 10, 2),
                   self.randn(2, 10, 4), [2, 6], lens_dtype=np.int64)

    def test_lengths_per_query_int64(self):
        self.check(self.randn(2, 3, 4), self.randn(2, 5, 4),
                   self.randn(2, 5, 6), [[1, 5, 3], [0, 2, 4]],
                   lens_dtype=np.int64)

    def test_requested_outputs_order(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 6)
        for outputs in (("attention_weights", "output"), ("output",),
                        ("attention_weights",)):
            with self.subTest(outputs=outputs):
                self.check(q, k, v, [[1, 5, 3], [0, 2, 4]], outputs=outputs)

    def test_no_outputs_requested_gives_just_output(self):
        # tritonclient then asks for binary_data_output; the raw request
        # below asks for JSON the same way.
        q, k, v = self.randn(4, 6, 8), self.randn(4, 9, 8), self.randn(4, 9, 5)
        want_out, _, _ = attention_ref(q, k, v)
        result = self.infer(self.MODEL, self.inputs(q, k, v))
        self.assertResponse(result, self.MODEL, ["output"], [(4, 6, 5)], True)
        binary = result.as_numpy("output")
        self.assertClose(binary.astype(np.float64), want_out, rtol=OUT_RTOL,
                         what="output")
        for flag in (False, True):
            with self.subTest(binary_data_output=flag):
                body, headers = binary_request(
                    self.inputs(q, k, v),
                    parameters={"binary_data_output": flag})
                raw = raw_request("POST", f"/v2/models/{self.MODEL}/infer",
                                  body, headers)
                self.assertEqual(raw.status, 200, raw)
                self.assertEqual(
                    "Inference-Header-Content-Length" in raw.headers, flag)
                header, arrays = parse_binary_response(raw)
                self.assertEqual([o["name"] for o in header["outputs"]],
                                 ["output"])
                self.assertEqual(arrays["output"].tobytes(), binary.tobytes())

    def test_binary_and_json_outputs_mixed(self):
        # binary_data per output overrides the request's binary_data_output.
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 6)
        want_out, want_w, mask = attention_ref(q, k, v, [3, 5])
        got = {}
        for default, weights_binary in ((True, False), (False, True)):
            with self.subTest(binary_data_output=default):
                body, headers = binary_request(
                    self.inputs(q, k, v, [3, 5]),
                    outputs=[{"name": "output"},
                             {"name": "attention_weights",
                              "parameters": {"binary_data": weights_binary}}],
                    parameters={"binary_data_output": default})
                raw = raw_request("POST", f"/v2/models/{self.MODEL}/infer",
                                  body, headers)
                self.assertEqual(raw.status, 200, raw)
                header, arrays = parse_binary_response(raw)
                kinds = ["data" in o for o in header["outputs"]]
                self.assertEqual(kinds, [not default, not weights_binary])
                self.assertClose(arrays["output"].astype(np.float64), want_out,
                                 rtol=OUT_RTOL, what="output")
                self.assertWeights(
                    arrays["attention_weights"].astype(np.float64), want_w,
                    mask)
                for name, array in arrays.items():
                    got.setdefault(name, []).append(array.tobytes())
        for name, forms in got.items():
            self.assertEqual(forms[0], forms[1], f"{name}: JSON vs binary")

    def test_json_data_nested_and_flat(self):
        # The protocol takes row-major data flat or nested.
        q, k, v = self.randn(2, 2, 3), self.randn(2, 4, 3), self.randn(2, 4, 2)
        want_out, _, _ = attention_ref(q, k, v)
        results = []
        for nested in (False, True):
            request = {"inputs": [
                {"name": n, "shape": list(a.shape), "datatype": "FP32",
                 "data": (a.tolist() if nested else a.ravel().tolist())}
                for n, a in self.inputs(q, k, v)]}
            raw = raw_request("POST", f"/v2/models/{self.MODEL}/infer",
                              json.dumps(request),
                              {"Content-Type": "application/json"})
            self.assertEqual(raw.status, 200, raw)
            _, arrays = parse_binary_response(raw)
            self.assertClose(arrays["output"].astype(np.float64), want_out,
                             rtol=OUT_RTOL, what=f"nested={nested}")
            results.append(arrays["output"].tobytes())
        self.assertEqual(results[0], results[1])

    def test_concurrent_requests(self):
        # Many requests in flight at once over several connections (with
        # --batching they meet in the dynamic batcher); JSON and binary
        # mixed. Each answer must be its own.
        client = httpclient.InferenceServerClient(
            url=HTTP_URL, concurrency=6, connection_timeout=DEADLINE_S,
            network_timeout=DEADLINE_S)
        try:
            Lq, Lk, d, dv = 3, 6, 4, 5
            cases = []
            for i in range(24):
                B = 1 + i % 3
                q, k, v = self.randn(B, Lq, d), self.randn(B, Lk, d), self.randn(B, Lk, dv)
                lens = (None if i % 3 == 0 else
                        self.rng.integers(0, Lk + 1, size=B) if i % 3 == 1 else
                        self.rng.integers(0, Lk + 1, size=(B, Lq)))
                if lens is not None:
                    lens = lens.astype(np.int32 if i % 2 else np.int64)
                binary = i % 4 < 2
                outputs = (["output", "attention_weights"] if i % 2
                           else ["output"])
                pending = client.async_infer(
                    self.MODEL,
                    [make_input(n, a, binary)
                     for n, a in self.inputs(q, k, v, lens)],
                    outputs=[httpclient.InferRequestedOutput(n, binary_data=binary)
                             for n in outputs],
                    request_id=f"req-{i}")
                cases.append(((q, k, v, lens), outputs, binary, pending))
            for i, ((q, k, v, lens), outputs, binary, pending) in enumerate(cases):
                with self.subTest(request=i):
                    result = pending.get_result(timeout=DEADLINE_S)
                    self.assertEqual(result.get_response()["id"], f"req-{i}")
                    B = q.shape[0]
                    self.assertResponse(result, self.MODEL, outputs,
                                        [(B, Lq, dv), (B, Lq, Lk)][:len(outputs)],
                                        binary)
                    want_out, want_w, mask = attention_ref(q, k, v, lens)
                    self.assertClose(self.get(result, "output"), want_out,
                                     rtol=OUT_RTOL, what=f"request {i}")
                    if "attention_weights" in outputs:
                        self.assertWeights(self.get(result, "attention_weights"),
                                           want_w, mask, f"request {i}")
        finally:
            client.close()


class NadarayaWatsonTest(HttpTestCase):
    MODEL = "nadaraya_watson"

    def textbook_data(self):
        x_train = np.sort(self.rng.random(50) * 5).astype(np.float32)
        y_train = (2 * np.sin(x_train) + x_train ** 0.8
                   + self.rng.normal(0.0, 0.5, 50)).astype(np.float32)
        x_query = np.arange(0, 5, 0.1, dtype=np.float32)
        return x_train, y_train, x_query

    def check(self, x_train, y_train, x_query, kernel=None, bandwidth=None,
              outputs=("y_pred", "attention_weights")):
        parameters = {}
        if kernel is not None:
            parameters["kernel"] = kernel
        if bandwidth is not None:
            parameters["bandwidth"] = float(bandwidth)
        M, N = len(x_query), len(x_train)
        shapes = {"y_pred": (M,), "attention_weights": (M, N)}
        want_pred, want_w = nadaraya_watson_ref(
            x_train, y_train, x_query, kernel or "gaussian",
            1.0 if bandwidth is None else bandwidth)
        what = f"{kernel or 'default'} kernel, bandwidth {bandwidth}"

        def check(got, how):
            if "y_pred" in got:
                self.assertClose(got["y_pred"], want_pred, atol=OUT_ATOL,
                                 rtol=OUT_RTOL, what=f"y_pred ({what}, {how})")
            if "attention_weights" in got:
                self.assertWeights(got["attention_weights"], want_w,
                                   want_w > 0,
                                   f"attention_weights ({what}, {how})")
        return self.run_both(
            self.MODEL,
            [("x_train", x_train), ("y_train", y_train), ("x_query", x_query)],
            list(outputs), [shapes[n] for n in outputs], check,
            parameters=parameters or None)

    def test_textbook_default_gaussian(self):
        self.check(*self.textbook_data())

    def test_requested_outputs_order(self):
        data = self.textbook_data()
        for outputs in (("attention_weights", "y_pred"), ("y_pred",),
                        ("attention_weights",)):
            with self.subTest(outputs=outputs):
                self.check(*data, kernel="boxcar", bandwidth=2.0,
                           outputs=outputs)

    def test_every_kernel_and_bandwidth(self):
        data = self.textbook_data()
        for kernel in ("gaussian", "boxcar", "constant", "epanechnikov"):
            for bandwidth in (None, 0.5, 3.0):
                with self.subTest(kernel=kernel, bandwidth=bandwidth):
                    self.check(*data, kernel=kernel, bandwidth=bandwidth)

    def test_zero_kernel_mass(self):
        x_train = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
        y_train = np.array([1.0, -2.0, 3.0, 5.0], np.float32)
        x_query = np.array([0.5, 10.0, 2.25], np.float32)
        for kernel in ("boxcar", "epanechnikov"):
            with self.subTest(kernel=kernel):
                got = self.check(x_train, y_train, x_query, kernel=kernel)
                self.assertEqual(got["y_pred"][1], 0.0)
                self.assertTrue(np.all(got["attention_weights"][1] == 0.0))


# --- Models of the repository (mode "repository" only). ---------------------


class RepositoryModelTest(HttpTestCase):

    def weights(self, model):
        return read_safetensors(os.path.join(REPOSITORY, model,
                                             "weights.safetensors"))

    def test_additive_attention(self):
        w = self.weights("additive_attention")
        q_size, k_size = w["W_q"].shape[1], w["W_k"].shape[1]
        queries, keys = self.randn(2, 3, q_size), self.randn(2, 5, k_size)
        values = self.randn(2, 5, 4)
        for lens in (np.array([2, 5], np.int32),
                     np.array([[1, 5, 0], [3, 2, 4]], np.int32), None):
            with self.subTest(valid_lens=None if lens is None else lens.shape):
                want_out, want_w, mask = additive_attention_ref(
                    w, queries, keys, values, lens)
                inputs = [("queries", queries), ("keys", keys),
                          ("values", values)]
                if lens is not None:
                    inputs.append(("valid_lens", lens))

                def check(got, how):
                    # tritonclient_test.py's bounds for this model.
                    np.testing.assert_allclose(got["attention_weights"],
                                               want_w, atol=1e-5,
                                               err_msg=how)
                    np.testing.assert_allclose(got["output"], want_out,
                                               atol=1e-4, err_msg=how)
                    self.assertTrue(np.all(got["attention_weights"][~mask]
                                           == 0.0), how)
                self.run_both("additive_attention", inputs,
                              ["output", "attention_weights"],
                              [(2, 3, 4), (2, 3, 5)], check)

    def test_nadaraya_watson_fitted(self):
        bandwidth = float(self.weights("nadaraya_watson_fitted")["bandwidth"][0])
        x = np.sort(self.rng.uniform(0, 5, 50)).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8
             + self.rng.normal(0, 0.5, 50)).astype(np.float32)
        xq = np.linspace(0, 5, 20, dtype=np.float32)
        want_pred, want_w = nadaraya_watson_ref(x, y, xq, "gaussian",
                                                bandwidth)

        def check(got, how):
            np.testing.assert_allclose(got["y_pred"], want_pred, atol=1e-4,
                                       err_msg=how)
            self.assertWeights(got["attention_weights"], want_w, want_w > 0,
                               f"attention_weights ({how})")
        self.run_both("nadaraya_watson_fitted",
                      [("x_train", x), ("y_train", y), ("x_query", xq)],
                      ["y_pred", "attention_weights"], [(20,), (20, 50)],
                      check)


# --- Live model control (mode "repository"). --------------------------------


class ModelControlTest(HttpTestCase):
    """POST /v2/repository/models/{m}/load | unload through tritonclient.http:
    a folder added while serving loads, serves, unloads (under load: each
    request answered, with its result or 404) and loads again; the index
    over HTTP and over gRPC agree at each step."""

    COPY = "additive_http"

    def state(self, name):
        """(state, reason) of `name` in the HTTP index, checked against the
        gRPC index."""
        index = self.http.get_model_repository_index()
        self.assertEqual(
            [as_proto(m, service_pb2.RepositoryIndexResponse.ModelIndex())
             for m in index],
            list(self.grpc.get_model_repository_index().models))
        for model in index:
            if model["name"] == name:
                return model["state"], model.get("reason", "")
        return None

    def test_load_unload(self):
        folder = os.path.join(REPOSITORY, self.COPY)
        shutil.copytree(os.path.join(REPOSITORY, "additive_attention"), folder)
        config = os.path.join(folder, "config.pbtxt")
        with open(config) as f:
            text = f.read().replace('"additive_attention"', f'"{self.COPY}"', 1)
        with open(config, "w") as f:
            f.write(text)
        try:
            self.assertEqual(self.state(self.COPY), ("UNAVAILABLE", "not loaded"))
            self.assertFalse(self.http.is_model_ready(self.COPY))
            self.http.load_model(self.COPY)
            self.assertEqual(self.state(self.COPY)[0], "READY")
            self.assertTrue(self.http.is_model_ready(self.COPY))
            self.assertTrue(self.grpc.is_model_ready(self.COPY))
            w = read_safetensors(os.path.join(folder, "weights.safetensors"))
            inputs = [("queries", self.randn(2, 3, w["W_q"].shape[1])),
                      ("keys", self.randn(2, 5, w["W_k"].shape[1])),
                      ("values", self.randn(2, 5, 4))]
            want = self.infer("additive_attention", inputs,
                              ["output"]).as_numpy("output")
            got = self.infer(self.COPY, inputs, ["output"]).as_numpy("output")
            self.assertEqual(got.tobytes(), want.tobytes(), "loaded copy")

            # Under load: 3 threads infer (their own clients) while the model
            # is unloaded and loaded again three times.
            stop = threading.Event()
            outcomes, lock = [], threading.Lock()

            def client_loop(binary):
                client = httpclient.InferenceServerClient(
                    url=HTTP_URL, network_timeout=DEADLINE_S)
                try:
                    while not stop.is_set():
                        try:
                            result = client.infer(
                                self.COPY,
                                [make_input(n, a, binary) for n, a in inputs],
                                outputs=[httpclient.InferRequestedOutput(
                                    "output", binary_data=binary)])
                            np.testing.assert_allclose(
                                result.as_numpy("output"), want, atol=1e-6)
                            outcome = "ok"
                        except InferenceServerException as e:
                            outcome = e.status()
                            if self.COPY not in e.message():
                                outcome += ": " + e.message()
                        except Exception as e:  # noqa: BLE001
                            outcome = f"{type(e).__name__}: {e}"
                        with lock:
                            outcomes.append(outcome)
                finally:
                    client.close()

            threads = [threading.Thread(target=client_loop, args=(i % 2 == 0,))
                       for i in range(3)]
            for t in threads:
                t.start()
            try:
                for _ in range(3):
                    time.sleep(0.1)
                    self.http.unload_model(self.COPY)
                    time.sleep(0.1)
                    self.http.load_model(self.COPY)
                time.sleep(0.1)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=DEADLINE_S)
            kinds = set(outcomes)
            self.assertIn("ok", kinds)
            self.assertLessEqual(kinds, {"ok", "404"}, kinds)

            self.http.unload_model(self.COPY)
            self.assertFalse(self.http.is_model_ready(self.COPY))
            for _ in range(50):
                if self.state(self.COPY)[0] != "UNLOADING":
                    break
                time.sleep(0.02)
            self.assertEqual(self.state(self.COPY), ("UNAVAILABLE", "unloaded"))
            self.assertHttpError(
                lambda: self.infer(self.COPY, inputs, ["output"]), 404,
                [self.COPY])
            raw = raw_request("POST", "/v2/repository/index", b'{"ready": true}')
            self.assertEqual(raw.status, 200, raw)
            names = [m["name"] for m in raw.json()]
            self.assertNotIn(self.COPY, names)
            self.assertIn("additive_attention", names)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            try:
                self.http.unload_model(self.COPY)
            except InferenceServerException:
                pass

    @staticmethod
    def safetensors(tensors):
        """The bytes of a weights.safetensors holding float32 `tensors`."""
        header, data = {}, b""
        for name, array in tensors.items():
            blob = np.ascontiguousarray(array, np.float32).tobytes()
            header[name] = {"dtype": "F32", "shape": list(array.shape),
                            "data_offsets": [len(data), len(data) + len(blob)]}
            data += blob
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data

    def test_upload_with_config_and_files(self):
        """tritonclient's load_model(name, config=, files=), unchanged, over
        both protocols: the model is written into the repository and served
        at once; a file name other than weights.safetensors is refused and
        nothing is written."""
        keys, values = self.randn(7, 4), self.randn(7, 3)
        files = {"file:weights.safetensors":
                 self.safetensors({"keys": keys, "values": values})}
        config = json.dumps({"backend": "attention_memory",
                             "parameters": {"score": {"string_value": "gaussian"}}})
        queries = self.randn(2, 3, 4)
        # The reference: the queries against the memory repeated per batch
        # entry, Gaussian scores with scale 1.
        s = -0.5 * ((queries[:, :, None, :].astype(np.float64) - keys) ** 2).sum(-1)
        w = np.exp(s - s.max(-1, keepdims=True))
        want = (w / w.sum(-1, keepdims=True)) @ values.astype(np.float64)
        names = {"uploaded_http": self.http, "uploaded_grpc": self.grpc}
        try:
            for name, client in names.items():
                client.load_model(name, config=config, files=files)
                self.assertEqual(self.state(name), ("READY", ""))
                got = self.infer(name, [("queries", queries)], ["output"])
                np.testing.assert_allclose(got.as_numpy("output"), want,
                                           atol=1e-5, err_msg=name)
                on_disk = read_safetensors(
                    os.path.join(REPOSITORY, name, "weights.safetensors"))
                np.testing.assert_array_equal(on_disk["keys"], keys)
            self.assertHttpError(
                lambda: self.http.load_model(
                    "uploaded_http", config=config,
                    files={"file:../escaped/weights.safetensors":
                           files["file:weights.safetensors"]}),
                400, ["file:../escaped/weights.safetensors"])
            self.assertFalse(os.path.exists(os.path.join(REPOSITORY, "escaped")))
            self.assertFalse(os.path.exists(os.path.join(os.path.dirname(REPOSITORY),
                                                         "escaped")))
            with self.assertRaises(InferenceServerException) as caught:
                self.grpc.load_model("uploaded_grpc", config=config,
                                     files={"file:1/model.onnx": b"\0"})
            self.assertIn("a model has one file", caught.exception.message())
        finally:
            for name in names:
                try:
                    self.http.unload_model(name)
                except InferenceServerException:
                    pass
                shutil.rmtree(os.path.join(REPOSITORY, name), ignore_errors=True)

    def test_uploads_unloads_and_loads_under_load(self):
        """Versions uploaded, unloaded and loaded again while 3 clients
        infer: every answer is one whole version (a memory whose values all
        equal v answers v everywhere), or 404 while it is unloaded; the
        index agrees over both protocols at the end."""
        name = "uploaded_under_load"
        keys = self.randn(16, 4)

        def files(version):
            values = np.full((16, 2), float(version), np.float32)
            return {"file:weights.safetensors":
                    self.safetensors({"keys": keys, "values": values})}
        config = json.dumps({"backend": "attention_memory"})
        self.http.load_model(name, config=config, files=files(1))
        queries = self.randn(1, 3, 4)
        stop = threading.Event()
        outcomes, lock = [], threading.Lock()

        def client_loop():
            client = httpclient.InferenceServerClient(
                url=HTTP_URL, network_timeout=DEADLINE_S)
            try:
                while not stop.is_set():
                    try:
                        got = client.infer(
                            name, [make_input("queries", queries, True)],
                            outputs=[httpclient.InferRequestedOutput(
                                "output", binary_data=True)]).as_numpy("output")
                        # The version nearest the first value: a weighted
                        # mean of equal values rounds to within an ulp or
                        # two of them, exactly or not as the CPU's kernel
                        # rounds; two versions are a whole 1 apart.
                        version = round(float(got.flat[0]))
                        whole = bool(np.allclose(got, version, rtol=0, atol=1e-5))
                        outcome = "ok" if whole else f"mixed {got.ravel().tolist()}"
                    except InferenceServerException as e:
                        outcome = e.status()
                    with lock:
                        outcomes.append(outcome)
            finally:
                client.close()

        threads = [threading.Thread(target=client_loop) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for version in range(2, 8):
                self.http.load_model(name, config=config, files=files(version))
                if version % 3 == 0:
                    self.http.unload_model(name)
                    time.sleep(0.05)
                    self.http.load_model(name)  # from disk: this version
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=DEADLINE_S)
            self.assertEqual(self.state(name), ("READY", ""))
            got = self.infer(name, [("queries", queries)], ["output"]).as_numpy("output")
            try:
                self.http.unload_model(name)
            except InferenceServerException:
                pass
            shutil.rmtree(os.path.join(REPOSITORY, name), ignore_errors=True)
        np.testing.assert_allclose(got, 7.0, atol=1e-5)
        kinds = set(outcomes)
        self.assertIn("ok", kinds)
        self.assertLessEqual(kinds, {"ok", "404"}, kinds)

    def test_refusals(self):
        self.assertHttpError(lambda: self.http.unload_model("batch_matmul"),
                             400, ["built in"])
        self.assertHttpError(lambda: self.http.load_model("no_such_folder"),
                             404, ["no_such_folder"])
        self.assertHttpError(
            lambda: self.http.load_model("additive_attention",
                                         config='{"backend": "x"}'),
            400, ["config: an upload is both"])
        # "../x" percent-encoded: one path segment, a name out of bounds.
        raw = raw_request("POST", "/v2/repository/models/..%2Fx/load")
        self.assertRawError(raw, 400)
        raw = raw_request("POST", "/v2/repository/models/additive_attention/load",
                          b'{"parameters": [1]}')
        self.assertRawError(raw, 400, ["parameters"])
        self.http.load_model("batch_matmul")  # built in: nothing to do
        self.assertIn("model_repository",
                      self.http.get_server_metadata()["extensions"])


class ModelControlOffTest(HttpTestCase):
    """Without --model_control_mode=explicit the models stay as loaded."""

    def test_load_and_unload_are_refused_naming_the_flag(self):
        for call in (lambda: self.http.unload_model("batch_matmul"),
                     lambda: self.http.load_model("batch_matmul")):
            self.assertHttpError(call, 400, ["--model_control_mode=explicit"])


if REPOSITORY:
    del ModelControlOffTest
else:
    del ModelControlTest
    del RepositoryModelTest


# --- Errors. ----------------------------------------------------------------


class ErrorTest(HttpTestCase):
    """Each error: its HTTP status and an {"error": ...} body naming the
    field, read by tritonclient (binary and JSON data) or, for what
    tritonclient cannot send, from a raw request."""

    def assertInvalid(self, model, inputs, names, outputs=None,
                      parameters=None):
        """INVALID_ARGUMENT (400) naming `names`, with binary data and with
        JSON data. `inputs`: [(name, array)] or callables binary ->
        InferInput."""
        for binary in (True, False):
            with self.subTest(data="binary" if binary else "JSON"):
                tensors = [t(binary) if callable(t) else make_input(*t, binary)
                           for t in inputs]
                requested = (None if outputs is None else
                             [httpclient.InferRequestedOutput(n, binary_data=binary)
                              for n in outputs])
                self.assertHttpError(
                    lambda: self.http.infer(model, tensors, outputs=requested,
                                            parameters=parameters),
                    400, names)

    def attention_inputs(self, d_keys=2):
        return [("queries", self.randn(2, 1, 2)),
                ("keys", self.randn(2, 10, d_keys)),
                ("values", self.randn(2, 10, 4))]

    def test_unknown_model(self):
        for binary in (True, False):
            self.assertHttpError(
                lambda: self.http.infer(
                    "no_such_model", [make_input("X", self.randn(1), binary)]),
                404, ["no_such_model"])

    def test_unknown_version(self):
        self.assertHttpError(
            lambda: self.infer("batch_matmul", [("X", self.randn(1, 2, 2)),
                                                ("Y", self.randn(1, 2, 2))],
                               version="2"),
            404, ["batch_matmul"])

    def test_wrong_rank(self):
        self.assertInvalid("masked_softmax", [("X", self.randn(3, 4))], ["X"])
        self.assertInvalid("batch_matmul", [("X", self.randn(3, 4)),
                                            ("Y", self.randn(2, 4, 5))], ["X"])

    def test_shapes_disagree(self):
        self.assertInvalid("dot_product_attention",
                           self.attention_inputs(d_keys=3), ["keys"])
        self.assertInvalid("batch_matmul", [("X", self.randn(2, 3, 4)),
                                            ("Y", self.randn(2, 5, 6))],
                           [("X", "Y")])

    def test_shape_and_data_disagree(self):
        # 24 floats sent, shape says 30: binary_data_size against the
        # shape, or a JSON data count against it.
        def x(binary):
            tensor = make_input("X", self.randn(2, 3, 4), binary)
            tensor.set_shape([2, 3, 5])
            return tensor
        self.assertInvalid("masked_softmax", [x], ["X"])

    def test_json_data_count_differs_from_shape(self):
        body = json.dumps({"inputs": [
            {"name": "X", "shape": [1, 2, 3], "datatype": "FP32",
             "data": [1, 2, 3, 4, 5]}]})
        raw = raw_request("POST", "/v2/models/masked_softmax/infer", body)
        self.assertRawError(raw, 400, ["X"])
        body = json.dumps({"inputs": [
            {"name": "X", "shape": [1, 2, 3], "datatype": "FP32",
             "data": [[[1, 2, 3], [4, 5, 6], [7, 8, 9]]]}]})
        raw = raw_request("POST", "/v2/models/masked_softmax/infer", body)
        self.assertRawError(raw, 400, ["X"])

    def test_wrong_datatype(self):
        self.assertInvalid("masked_softmax",
                           [("X", self.randn(1, 2, 3).astype(np.float64))],
                           ["X"])
        self.assertInvalid(
            "masked_softmax",
            [("X", self.randn(2, 3, 4)),
             ("valid_lens", np.array([1, 2], np.float32))], ["valid_lens"])

    def test_json_data_not_of_its_datatype(self):
        for data, name in (([1.5, 2], "valid_lens"), ([True, 1], "valid_lens"),
                           (["a", 1], "valid_lens"), ([1, 2**40], "valid_lens")):
            with self.subTest(data=data):
                body = json.dumps({"inputs": [
                    {"name": "X", "shape": [2, 1, 3], "datatype": "FP32",
                     "data": [1, 2, 3, 4, 5, 6]},
                    {"name": name, "shape": [2], "datatype": "INT32",
                     "data": data}]})
                raw = raw_request("POST", "/v2/models/masked_softmax/infer",
                                  body)
                self.assertRawError(raw, 400, [name])

    def test_nan_input(self):
        x = self.randn(2, 2, 4)
        x[1, 0, 2] = np.nan
        # NaN has no JSON form: binary only.
        self.assertHttpError(
            lambda: self.infer("masked_softmax", [("X", x)]), 400, ["X"])

    def test_missing_and_unknown_input_and_output(self):
        self.assertInvalid("batch_matmul", [("X", self.randn(2, 3, 4))], ["Y"])
        self.assertInvalid("masked_softmax", [("X", self.randn(1, 2, 3)),
                                              ("W", self.randn(1, 2, 3))],
                           ["W"])
        self.assertInvalid("masked_softmax", [("X", self.randn(1, 2, 3))],
                           ["Z"], outputs=["Z"])

    def test_length_above_keys(self):
        self.assertInvalid(
            "dot_product_attention",
            self.attention_inputs() + [("valid_lens",
                                        np.array([2, 11], np.int32))],
            ["valid_lens"])

    def test_unknown_kernel(self):
        self.assertInvalid(
            "nadaraya_watson",
            [("x_train", np.array([0.0, 1.0], np.float32)),
             ("y_train", np.array([0.0, 1.0], np.float32)),
             ("x_query", np.array([0.5], np.float32))], ["kernel"],
            parameters={"kernel": "triangle"})

    def test_bad_json(self):
        for body in (b"{bad", b'{"inputs": [', b"[]", b"",
                     b'{"inputs": []} trailing', b"\xff\xfe"):
            with self.subTest(body=body):
                raw = raw_request("POST", "/v2/models/batch_matmul/infer",
                                  body, {"Content-Type": "application/json"})
                message = self.assertRawError(raw, 400)
                self.assertRegex(message, r"JSON|empty|body|request", message)

    def test_unknown_field(self):
        body = json.dumps({"inputs": [
            {"name": "X", "shape": [1, 1, 1], "datatype": "FP32", "data": [1],
             "colour": "red"}]})
        raw = raw_request("POST", "/v2/models/masked_softmax/infer", body)
        self.assertRawError(raw, 400, ["colour"])

    def test_body_over_the_limit(self):
        # 2 MiB against --max_message_bytes=1048576: 413 as soon as the
        # Content-Length is read, before the body is (libevent's evhttp
        # answers it itself, with its short HTML page: docs/http.md,
        # "Errors"), and the connection is closed.
        body = b" " * (2 << 20)
        try:
            raw = raw_request("POST", "/v2/models/batch_matmul/infer", body,
                              {"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError) as e:
            self.fail(f"the connection broke before the 413 was read: {e!r}")
        self.assertEqual(raw.status, 413, raw)
        self.assertEqual((raw.headers.get("Connection") or "").lower(),
                         "close", raw)

    def test_body_over_the_limit_through_tritonclient(self):
        # tritonclient raises with the status, 413 (it cannot read the HTML
        # page as JSON, and says so in the message).
        x = np.ones((1, 512, 1024), np.float32)  # 2 MiB of binary data
        with self.assertRaises(InferenceServerException) as caught:
            self.infer("batch_matmul",
                       [("X", x), ("Y", np.ones((1, 1024, 1), np.float32))])
        self.assertEqual(caught.exception.status(), "413",
                         caught.exception.message())

    def test_compressed_request(self):
        # tritonclient's request_compression_algorithm: gzip and deflate
        # bodies are inflated (at most --max_message_bytes of them) and
        # served like plain ones; another encoding is refused (415).
        x, y = self.randn(1, 2, 3), self.randn(1, 3, 2)
        want = batch_matmul_ref(x, y)
        for algorithm in ("gzip", "deflate"):
            with self.subTest(algorithm=algorithm):
                inputs = [httpclient.InferInput(n, list(a.shape), "FP32")
                          for n, a in (("X", x), ("Y", y))]
                for tensor, (_, a) in zip(inputs, (("X", x), ("Y", y))):
                    tensor.set_data_from_numpy(a)
                result = self.http.infer(
                    "batch_matmul", inputs,
                    request_compression_algorithm=algorithm)
                self.assertClose(result.as_numpy("Z"), want)
        import zlib
        bomb = zlib.compress(b"\0" * (4 << 20))  # inflates past the limit
        raw = raw_request("POST", "/v2/models/batch_matmul/infer", bomb,
                          {"Content-Encoding": "deflate"})
        self.assertRawError(raw, 413, ["--max_message_bytes"])
        raw = raw_request("POST", "/v2/models/batch_matmul/infer", b"{}",
                          {"Content-Encoding": "br"})
        self.assertRawError(raw, 415, ["Content-Encoding"])

    def test_json_response_over_the_limit(self):
        # 160000 weights: 640 kB as binary data, some 2 MB as JSON text,
        # over --max_message_bytes: RESOURCE_EXHAUSTED (429) naming the way
        # out; the same request with binary outputs is served.
        q, k, v = self.randn(1, 400, 2), self.randn(1, 400, 2), self.randn(1, 400, 1)
        result = self.infer("dot_product_attention",
                            [("queries", q), ("keys", k), ("values", v)],
                            ["attention_weights"])
        self.assertEqual(result.as_numpy("attention_weights").shape,
                         (1, 400, 400))
        self.assertHttpError(
            lambda: self.infer("dot_product_attention",
                               [("queries", q), ("keys", k), ("values", v)],
                               ["attention_weights"], binary=False),
            429, [("--max_message_bytes", str(MAX_MESSAGE_BYTES)),
                  "binary_data"])

    def test_truncated_binary_section(self):
        x, y = self.randn(1, 2, 3), self.randn(1, 3, 2)
        body, headers = binary_request([("X", x), ("Y", y)])
        raw = raw_request("POST", "/v2/models/batch_matmul/infer", body[:-4],
                          headers)
        message = self.assertRawError(raw, 400, ["Y"])
        self.assertIn("binary_data_size", message)
        # Longer than the inputs say.
        body, headers = binary_request([("X", x), ("Y", y)], extra=b"\0" * 4)
        raw = raw_request("POST", "/v2/models/batch_matmul/infer", body,
                          headers)
        self.assertRawError(raw, 400, ["binary_data_size"])

    def test_header_length_beyond_the_body(self):
        x, y = self.randn(1, 2, 3), self.randn(1, 3, 2)
        body, headers = binary_request([("X", x), ("Y", y)])
        for length in (str(len(body) + 1), "-1", "12x"):
            with self.subTest(length=length):
                headers["Inference-Header-Content-Length"] = length
                raw = raw_request("POST", "/v2/models/batch_matmul/infer",
                                  body, headers)
                self.assertRawError(raw, 400,
                                    ["Inference-Header-Content-Length"])

    def test_both_data_and_binary_data_size(self):
        x = self.randn(1, 2, 3)
        header = json.dumps({"inputs": [
            {"name": "X", "shape": [1, 2, 3], "datatype": "FP32",
             "data": x.ravel().tolist(),
             "parameters": {"binary_data_size": x.nbytes}}]}).encode()
        raw = raw_request("POST", "/v2/models/masked_softmax/infer",
                          header + x.tobytes(),
                          {"Inference-Header-Content-Length": str(len(header))})
        message = self.assertRawError(raw, 400, ["X", "binary_data_size"])
        self.assertIn("data", message)

    def test_binary_data_size_not_an_integer(self):
        header = json.dumps({"inputs": [
            {"name": "X", "shape": [1, 1, 1], "datatype": "FP32",
             "parameters": {"binary_data_size": "4"}}]}).encode()
        raw = raw_request("POST", "/v2/models/masked_softmax/infer",
                          header + b"\0\0\x80?",
                          {"Inference-Header-Content-Length": str(len(header))})
        self.assertRawError(raw, 400, ["binary_data_size"])


# --- The protocol's other promises. -----------------------------------------


class ProtocolTest(HttpTestCase):

    def test_request_id_echoed(self):
        x, y = self.randn(2, 3, 4), self.randn(2, 4, 5)
        for binary in (True, False):
            with self.subTest(binary=binary):
                result = self.infer("batch_matmul", [("X", x), ("Y", y)],
                                    ["Z"], binary=binary,
                                    request_id="req-\u00e9 \"42\"")
                self.assertEqual(result.get_response()["id"],
                                 "req-\u00e9 \"42\"")
        result = self.infer("batch_matmul", [("X", x), ("Y", y)], ["Z"])
        self.assertNotIn("id", result.get_response())

    def test_priority_and_timeout_accepted(self):
        x, y = self.randn(2, 3, 4), self.randn(2, 4, 5)
        for binary in (True, False):
            with self.subTest(binary=binary):
                result = self.infer("batch_matmul", [("X", x), ("Y", y)],
                                    ["Z"], binary=binary, priority=1,
                                    timeout=10_000_000)
                self.assertClose(self.get(result, "Z"), batch_matmul_ref(x, y),
                                 rtol=OUT_RTOL, what="Z")

    def test_unknown_path(self):
        for method, path in (("GET", "/"), ("GET", "/v3/models"),
                             ("GET", "/v2/nothing"),
                             ("GET", "/v2/models/batch_matmul/weights"),
                             ("POST", "/v2/repository/elsewhere")):
            with self.subTest(method=method, path=path):
                self.assertRawError(raw_request(method, path), 404)

    def test_wrong_method(self):
        # RFC 9110 15.5.6 (and Triton): 405 Method Not Allowed, with an
        # Allow header naming the method the resource takes.
        for method, path, allowed in (
                ("GET", "/v2/models/batch_matmul/infer", "POST"),
                ("POST", "/v2/health/ready", "GET"),
                ("POST", "/v2/models/batch_matmul", "GET"),
                ("GET", "/v2/repository/index", "POST")):
            with self.subTest(method=method, path=path):
                raw = raw_request(method, path)
                self.assertRawError(raw, 405, [allowed])
                self.assertEqual(raw.headers.get("Allow"), allowed, raw)

    def test_method_the_server_does_not_take(self):
        # Not GET or POST: refused (405, or 501 for a method the server
        # does not implement at all) with the {"error": ...} body of every
        # REST error.
        for method in ("PUT", "DELETE"):
            with self.subTest(method=method):
                raw = raw_request(method, "/v2/models/batch_matmul/infer")
                self.assertIn(raw.status, (405, 501), raw)
                self.assertRawError(raw, raw.status)

    def test_keep_alive(self):
        # Several requests, JSON and binary, on one connection.
        connection = http.client.HTTPConnection("127.0.0.1", HTTP_PORT,
                                                timeout=DEADLINE_S)
        try:
            x, y = self.randn(1, 2, 3), self.randn(1, 3, 2)
            want = batch_matmul_ref(x, y)
            for i in range(6):
                if i % 2:
                    body, headers = binary_request(
                        [("X", x), ("Y", y)],
                        parameters={"binary_data_output": True})
                else:
                    body = json.dumps({"inputs": [
                        {"name": n, "shape": list(a.shape), "datatype": "FP32",
                         "data": a.ravel().tolist()} for n, a in
                        (("X", x), ("Y", y))]})
                    headers = {"Content-Type": "application/json"}
                connection.request("POST", "/v2/models/batch_matmul/infer",
                                   body, headers)
                response = connection.getresponse()
                raw = Raw(response.status, response.headers, response.read())
                self.assertEqual(raw.status, 200, raw)
                _, arrays = parse_binary_response(raw)
                self.assertClose(arrays["Z"].astype(np.float64), want,
                                 rtol=OUT_RTOL, what=f"request {i}")
                self.assertNotEqual(
                    (response.getheader("Connection") or "").lower(), "close")
        finally:
            connection.close()

    def test_pipelined_requests_answered_in_order(self):
        # HTTP/1.1 pipelining: five requests written at once on one
        # connection, five answers in the order asked.
        requests = b""
        for i in range(5):
            body = json.dumps({"id": f"p{i}", "inputs": [
                {"name": "X", "shape": [1, 1, 2], "datatype": "FP32",
                 "data": [i, 1]},
                {"name": "Y", "shape": [1, 2, 1], "datatype": "FP32",
                 "data": [1, 1]}]}).encode()
            requests += (b"POST /v2/models/batch_matmul/infer HTTP/1.1\r\n"
                         b"Host: 127.0.0.1\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        with socket.create_connection(("127.0.0.1", HTTP_PORT),
                                      timeout=DEADLINE_S) as sock:
            sock.sendall(requests)
            reader = sock.makefile("rb")
            for i in range(5):
                status_line = reader.readline()
                self.assertTrue(status_line.startswith(b"HTTP/1.1 200"),
                                status_line)
                length = None
                while (line := reader.readline().strip()):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                self.assertIsNotNone(length, f"answer {i}: no Content-Length")
                answer = json.loads(reader.read(length))
                self.assertEqual(answer["id"], f"p{i}")
                self.assertEqual(answer["outputs"][0]["data"], [i + 1])

    def test_client_gone_before_the_answer(self):
        # Clients that send an inference and close (or reset) the connection
        # before the answer: the server lets the answer go and serves on.
        q = self.randn(4, 128, 32)
        inputs = [("queries", q), ("keys", q), ("values", q)]
        body, headers = binary_request(inputs,
                                       outputs=[{"name": "attention_weights"}])
        head = ("POST /v2/models/dot_product_attention/infer HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\n" +
                "".join(f"{k}: {v}\r\n" for k, v in headers.items()) +
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for i in range(20):
            sock = socket.create_connection(("127.0.0.1", HTTP_PORT),
                                            timeout=DEADLINE_S)
            sock.sendall(head + body)
            if i % 2:  # RST rather than FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))
            sock.close()
        self.assertTrue(self.http.is_server_live())
        result = self.infer("dot_product_attention", inputs,
                            ["attention_weights"])
        _, want_w, mask = attention_ref(q, q, q)
        self.assertWeights(self.get(result, "attention_weights"), want_w, mask)


# --- curl lines like the README's. -----------------------------------------------


def run_curl(line):
    """Runs one of CURL_LINES as written (PORT replaced): its stdout."""
    args = shlex.split(line.replace("PORT", str(HTTP_PORT)))
    done = subprocess.run(args, capture_output=True, timeout=DEADLINE_S,
                          check=False)
    if done.returncode != 0:
        raise AssertionError(f"{line}: curl exit {done.returncode}: "
                             f"{done.stderr.decode(errors='replace')}")
    return done.stdout.decode()


class CurlTest(HttpTestCase):

    def test_ready(self):
        self.assertEqual(run_curl(CURL_LINES[0]), "200")

    def test_model_metadata(self):
        metadata = json.loads(run_curl(CURL_LINES[1]))
        self.assertEqual(metadata, self.http.get_model_metadata(
            "dot_product_attention"))

    def test_infer(self):
        answer = json.loads(run_curl(CURL_LINES[2]))
        request = json.loads(shlex.split(CURL_LINES[2])[-1])
        arrays = {i["name"]: np.array(i["data"]) for i in request["inputs"]}
        want_out, want_w, mask = attention_ref(
            arrays["queries"], arrays["keys"], arrays["values"],
            arrays["valid_lens"])
        self.assertEqual(answer["model_name"], "dot_product_attention")
        outputs = {o["name"]: o for o in answer["outputs"]}
        self.assertEqual(list(outputs), ["output", "attention_weights"])
        self.assertEqual(outputs["output"]["shape"], [1, 1, 2])
        self.assertEqual(outputs["attention_weights"]["shape"], [1, 1, 3])
        got_out = np.array(outputs["output"]["data"], np.float64).reshape(1, 1, 2)
        got_w = np.array(outputs["attention_weights"]["data"],
                         np.float64).reshape(1, 1, 3)
        self.assertClose(got_out, want_out, rtol=OUT_RTOL, what="output")
        self.assertWeights(got_w, want_w, mask)


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(
        sys.modules[__name__])
    print(f"tritonclient_http_test.py: http {HTTP_URL}, grpc {TARGET}, "
          f"mode {MODE}, seed {SEED} (ATTNSERVE_TEST_SEED)")
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    # Tests, not subtests: a test with three failing subtests is one failure.
    failed = len({getattr(test, "test_case", test).id()
                  for test, _ in result.failures + result.errors})
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
