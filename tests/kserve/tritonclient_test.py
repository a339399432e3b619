"""attnserve's KServe v2 / Triton gRPC API, driven by the real tritonclient.

Calls every RPC the server implements through tritonclient.grpc's
InferenceServerClient (health, server/model metadata, model config,
repository index, inference) and checks every inference against the small
float64 numpy reference below (obvious loops and formulas, nothing shared
with the C++ code). Data goes in with InferInput.set_data_from_numpy and comes
back with InferResult.as_numpy, as any Triton user would do it.

The models (version "1", row-major, FP32 unless noted):
  masked_softmax         X [B,Q,K], valid_lens INT32 [B] or [B,Q] (optional)
                         -> Y [B,Q,K]
  batch_matmul           X [n,m,k], Y [n,k,p] -> Z [n,m,p]
  dot_product_attention  queries [B,Lq,d], keys [B,Lk,d], values [B,Lk,v],
                         valid_lens (optional) -> output [B,Lq,v],
                         attention_weights [B,Lq,Lk] (only when requested)
  nadaraya_watson        x_train [N], y_train [N], x_query [M]; parameters
                         kernel (string), bandwidth (double)
                         -> y_pred [M], attention_weights [M,N] (on request)

Environment: ATTNSERVE_TARGET (host:port, required), ATTNSERVE_MODE (a label
for the server's flags; "batching" also checks that ModelConfig reports the
dynamic batcher), ATTNSERVE_TEST_SEED (replays), and optionally the typed
API's generated stubs (attention/v1/attention_pb2*.py) on PYTHONPATH for the
cross-check of both APIs; run_tritonclient_test.sh sets all of them up.
Plain unittest; the last line printed is "N passed, M failed".
"""

import math
import os
import re
import sys
import threading
import time
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

# The typed API's stubs, for the cross-check: run_tritonclient_test.sh
# generates them onto PYTHONPATH (by hand: grpc_tools.protoc, see there).
import grpc
from attention.v1 import attention_pb2 as typed_pb
from attention.v1 import attention_pb2_grpc as typed_pb_grpc

TARGET = os.environ.get("ATTNSERVE_TARGET", "127.0.0.1:8001")
MODE = os.environ.get("ATTNSERVE_MODE", "plain")
SEED = int(os.environ.get("ATTNSERVE_TEST_SEED", "20240611"))
# The server's --model_repository, when it was started with one (mode
# "repository"): its models are then expected in the index and tested below.
REPOSITORY = os.environ.get("ATTNSERVE_REPOSITORY", "")
DEADLINE_S = 20.0

# Tolerances against the float64 reference.
WEIGHT_ATOL = 1e-5   # softmax / attention weights (absolute)
OUT_ATOL = 1e-5      # attention outputs, predictions
OUT_RTOL = 1e-4      # matmul-like results (relative)

MODELS = ("masked_softmax", "batch_matmul", "dot_product_attention",
          "nadaraya_watson")


# --------------------------------------------------------------------------
# The float64 reference.


def f64(array):
    """What the server sees: the input as float32, back in float64."""
    return np.asarray(array, dtype=np.float32).astype(np.float64)


def row_mask(B, Q, K, valid_lens=None):
    """Boolean (B, Q, K): True where position k of row (b, q) takes part."""
    mask = np.ones((B, Q, K), dtype=bool)
    if valid_lens is not None:
        lens = np.asarray(valid_lens)
        if lens.ndim == 1:
            lens = np.repeat(lens[:, None], Q, axis=1)
        for b in range(B):
            for q in range(Q):
                mask[b, q, lens[b, q]:] = False
    return mask


def masked_softmax_ref(x, valid_lens=None):
    """Softmax over the last axis of the first valid_len entries of a row;
    the rest exactly 0; a row of valid length 0 is all zero. `x` is used as
    given (float64); returns (softmax, mask)."""
    x = np.asarray(x, dtype=np.float64)
    B, Q, K = x.shape
    mask = row_mask(B, Q, K, valid_lens)
    out = np.zeros_like(x)
    for b in range(B):
        for q in range(Q):
            keep = mask[b, q]
            if not keep.any():
                continue
            s = x[b, q, keep]
            e = np.exp(s - s.max())
            out[b, q, keep] = e / e.sum()
    return out, mask


def batch_matmul_ref(x, y):
    x, y = f64(x), f64(y)
    n, m, _ = x.shape
    p = y.shape[2]
    z = np.zeros((n, m, p))
    for i in range(n):
        z[i] = x[i] @ y[i]
    return z


def attention_ref(q, k, v, valid_lens=None):
    """(output, weights, mask) of scaled dot-product attention, 1/sqrt(d)."""
    q, k, v = f64(q), f64(k), f64(v)
    d = q.shape[-1]
    scores = np.einsum("bqd,bkd->bqk", q, k) / math.sqrt(d)
    weights, mask = masked_softmax_ref(scores, valid_lens)
    return weights @ v, weights, mask


def nadaraya_watson_ref(x_train, y_train, x_query, kernel="gaussian",
                        bandwidth=1.0):
    """(y_pred, weights): weights = K(w |x - x_i|) normalised over i; a query
    without kernel mass gets zero weights and prediction 0."""
    xt, yt, xq = f64(x_train), f64(y_train), f64(x_query)
    u = bandwidth * np.abs(xq[:, None] - xt[None, :])  # (M, N)
    if kernel == "gaussian":
        logits = -u ** 2 / 2  # normalised as a softmax: never zero mass
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        w = e / e.sum(axis=1, keepdims=True)
        return w @ yt, w
    if kernel == "boxcar":
        mass = (u < 1).astype(np.float64)
    elif kernel == "constant":
        mass = np.ones_like(u)
    elif kernel == "epanechnikov":
        mass = np.maximum(0.0, 1.0 - u)
    else:
        raise ValueError(kernel)
    total = mass.sum(axis=1, keepdims=True)
    w = np.divide(mass, total, out=np.zeros_like(mass), where=total > 0)
    return w @ yt, w


# --------------------------------------------------------------------------
# The tests.


def make_input(name, array):
    array = np.ascontiguousarray(array)
    tensor = grpcclient.InferInput(name, list(array.shape),
                                   np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


class KServeTestCase(unittest.TestCase):
    client = None

    @classmethod
    def setUpClass(cls):
        cls.client = grpcclient.InferenceServerClient(url=TARGET)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def setUp(self):
        self.rng = np.random.default_rng(SEED)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def infer(self, model, inputs, outputs=None, parameters=None,
              version=""):
        """Runs `model` on `inputs` ([(name, array)]) and returns the result.

        `outputs`: names to request (None requests none).
        """
        requested = None
        if outputs is not None:
            requested = [grpcclient.InferRequestedOutput(n) for n in outputs]
        return self.client.infer(
            model, [make_input(n, a) for n, a in inputs],
            model_version=version, outputs=requested, parameters=parameters,
            client_timeout=DEADLINE_S)

    def assertResponse(self, result, model, names, shapes):
        """The response carries exactly `names` in this order, FP32, with
        these shapes, one raw_output_contents entry each of the right size."""
        response = result.get_response()
        self.assertEqual(response.model_name, model)
        self.assertEqual(response.model_version, "1")
        self.assertEqual([o.name for o in response.outputs], list(names),
                         f"{model}: output names/order")
        self.assertEqual(len(response.raw_output_contents), len(names),
                         f"{model}: one raw_output_contents per output")
        for output, raw, shape in zip(response.outputs,
                                      response.raw_output_contents, shapes):
            self.assertEqual(output.datatype, "FP32", output.name)
            self.assertEqual(list(output.shape), list(shape),
                             f"{model}: {output.name} shape")
            self.assertEqual(len(raw), 4 * int(np.prod(shape)),
                             f"{model}: {output.name} raw byte count")

    def get(self, result, name):
        array = result.as_numpy(name)
        self.assertIsNotNone(array, f"no output {name!r}")
        self.assertEqual(array.dtype, np.float32, name)
        return array.astype(np.float64)

    def assertClose(self, got, want, atol=OUT_ATOL, rtol=0.0, what=""):
        self.assertEqual(got.shape, want.shape, f"{what}: shape")
        err = np.abs(got - want) - rtol * np.abs(want)
        worst = np.unravel_index(np.argmax(err), err.shape) if err.size else ()
        self.assertTrue(
            np.all(err <= atol),
            f"{what}: max |got - want| = {np.abs(got - want).max():.3g} at "
            f"{worst}: got {got[worst] if err.size else None!r}, "
            f"want {want[worst] if err.size else None!r}")

    def assertWeights(self, got, want, mask, what="weights"):
        """Close to the reference, exactly 0 where masked, rows summing to 1
        (or all zero when nothing is valid)."""
        self.assertClose(got, want, atol=WEIGHT_ATOL, what=what)
        masked = got[~mask]
        self.assertTrue(np.all(masked == 0.0),
                        f"{what}: masked positions are not exactly 0: "
                        f"{masked[masked != 0][:5]}")
        sums = got.sum(-1)
        live = mask.any(-1)
        self.assertTrue(np.allclose(sums[live], 1.0, atol=1e-5),
                        f"{what}: live rows do not sum to 1: {sums[live]}")
        self.assertTrue(np.all(sums[~live] == 0.0),
                        f"{what}: empty rows are not all zero")


# --- Server and model RPCs. -------------------------------------------------

# name -> (inputs [(name, datatype, rank)], outputs [...], max_batch_size);
# rank None: valid_lens, [B] or [B,Q].
MODEL_SIGNATURES = {
    "masked_softmax": (
        [("X", "FP32", 3), ("valid_lens", "INT32", None)],
        [("Y", "FP32", 3)], 0),
    "batch_matmul": (
        [("X", "FP32", 3), ("Y", "FP32", 3)],
        [("Z", "FP32", 3)], 0),
    "dot_product_attention": (
        [("queries", "FP32", 3), ("keys", "FP32", 3), ("values", "FP32", 3),
         ("valid_lens", "INT32", None)],
        [("output", "FP32", 3), ("attention_weights", "FP32", 3)], 32),
    "nadaraya_watson": (
        [("x_train", "FP32", 1), ("y_train", "FP32", 1),
         ("x_query", "FP32", 1)],
        [("y_pred", "FP32", 1), ("attention_weights", "FP32", 2)], 0),
}


class ServerRpcTest(KServeTestCase):

    def test_server_live_and_ready(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())

    def test_model_ready(self):
        for model in MODELS:
            self.assertTrue(self.client.is_model_ready(model), model)
            self.assertTrue(self.client.is_model_ready(model, "1"), model)

    def test_unknown_model_or_version_is_not_ready(self):
        # Triton answers ready=false here; an error is fine too.
        for model, version in (("no_such_model", ""), ("masked_softmax", "2")):
            try:
                ready = self.client.is_model_ready(model, version)
            except InferenceServerException:
                continue
            self.assertFalse(ready, f"{model} version {version!r}")

    def test_server_metadata(self):
        metadata = self.client.get_server_metadata()
        self.assertEqual(metadata.name, "attnserve")
        self.assertIn("model_configuration", list(metadata.extensions))

    def test_model_metadata(self):
        for model, (inputs, outputs, _) in MODEL_SIGNATURES.items():
            with self.subTest(model=model):
                metadata = self.client.get_model_metadata(model)
                self.assertEqual(metadata.name, model)
                self.assertIn("1", list(metadata.versions))
                self.assertEqual(
                    self.client.get_model_metadata(model, "1").name, model)
                for got, want, kind in ((metadata.inputs, inputs, "input"),
                                        (metadata.outputs, outputs, "output")):
                    self.assertEqual(sorted(t.name for t in got),
                                     sorted(n for n, _, _ in want), f"{kind}s")
                    by_name = {t.name: t for t in got}
                    for name, datatype, rank in want:
                        tensor = by_name[name]
                        self.assertEqual(tensor.datatype, datatype, name)
                        shape = list(tensor.shape)
                        if rank is None:  # valid_lens: [B] or [B,Q]
                            self.assertIn(len(shape), (1, 2),
                                          f"{name} shape {shape}")
                        else:
                            self.assertEqual(len(shape), rank,
                                             f"{name} shape {shape}")
                        self.assertEqual(shape, [-1] * len(shape),
                                         f"{name}: variable dims are -1")

    def test_model_config(self):
        for model, (inputs, outputs, max_batch) in MODEL_SIGNATURES.items():
            with self.subTest(model=model):
                config = self.client.get_model_config(model).config
                self.assertEqual(config.name, model)
                self.assertEqual(config.max_batch_size, max_batch)
                self.assertEqual(sorted(t.name for t in config.input),
                                 sorted(n for n, _, _ in inputs))
                self.assertEqual(sorted(t.name for t in config.output),
                                 sorted(n for n, _, _ in outputs))
        # The batcher shows in dot_product_attention's config exactly when
        # the server runs with --batching.
        config = self.client.get_model_config("dot_product_attention").config
        self.assertEqual(config.HasField("dynamic_batching"),
                         MODE == "batching",
                         f"mode {MODE}: dynamic_batching in config")

    def test_repository_index(self):
        index = self.client.get_model_repository_index()
        expected = list(MODELS)
        if REPOSITORY:
            expected += [name for name in os.listdir(REPOSITORY)
                         if os.path.isdir(os.path.join(REPOSITORY, name))]
        self.assertEqual(sorted(m.name for m in index.models), sorted(expected))
        for model in index.models:
            self.assertEqual(model.state, "READY", model.name)
            self.assertIn(model.version, ("1", ""), model.name)

    def test_model_statistics_count_calls(self):
        def stats():
            return self.client.get_inference_statistics(
                "batch_matmul").model_stats[0]
        self.assertIn("statistics", self.client.get_server_metadata().extensions)
        before = stats()
        a, b = self.randn(2, 3, 4), self.randn(2, 4, 5)
        for _ in range(3):
            self.infer("batch_matmul", [("X", a), ("Y", b)])
        with self.assertRaises(InferenceServerException):
            self.infer("batch_matmul", [("X", a), ("Y", self.randn(2, 5, 5))])
        after = stats()
        self.assertEqual(after.name, "batch_matmul")
        self.assertEqual(after.inference_count - before.inference_count, 3)
        self.assertEqual(after.execution_count - before.execution_count, 3)
        s0, s1 = before.inference_stats, after.inference_stats
        self.assertEqual(s1.success.count - s0.success.count, 3)
        self.assertGreater(s1.success.ns, s0.success.ns)
        self.assertEqual(s1.fail.count - s0.fail.count, 1)
        # The mismatched call failed validation: no kernel ran for it.
        self.assertEqual(s1.compute_infer.count - s0.compute_infer.count, 3)
        self.assertGreater(s1.compute_infer.ns, s0.compute_infer.ns)
        self.assertGreater(after.last_inference, 0)
        # Every model is listed when no name is given.
        every = self.client.get_inference_statistics()
        self.assertGreaterEqual({m.name for m in every.model_stats}, set(MODELS))

    def test_unknown_model_metadata_and_config(self):
        for call in (self.client.get_model_metadata,
                     self.client.get_model_config):
            with self.assertRaises(InferenceServerException) as caught:
                call("no_such_model")
            self.assertIn("no_such_model", caught.exception.message())


# --- masked_softmax. --------------------------------------------------------


class MaskedSoftmaxTest(KServeTestCase):

    def run_case(self, x, valid_lens=None):
        inputs = [("X", x)]
        if valid_lens is not None:
            inputs.append(("valid_lens", np.asarray(valid_lens, np.int32)))
        result = self.infer("masked_softmax", inputs)
        self.assertResponse(result, "masked_softmax", ["Y"], [x.shape])
        want, mask = masked_softmax_ref(f64(x), valid_lens)
        self.assertWeights(self.get(result, "Y"), want, mask, "Y")

    def test_textbook_lengths_per_batch(self):
        # d2l 11.3: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])).
        self.run_case(self.rng.random((2, 2, 4), dtype=np.float32), [2, 3])

    def test_textbook_lengths_per_row(self):
        self.run_case(self.rng.random((2, 2, 4), dtype=np.float32),
                      [[1, 3], [2, 4]])

    def test_no_lengths(self):
        self.run_case(3 * self.randn(3, 4, 7))

    def test_lengths_per_batch_with_zero(self):
        self.run_case(self.randn(3, 2, 5), [0, 5, 2])

    def test_lengths_per_row_with_zero(self):
        self.run_case(self.randn(2, 3, 5), [[1, 0, 5], [3, 2, 0]])

    def test_outputs_requested_by_name(self):
        x = self.randn(1, 2, 3)
        result = self.infer("masked_softmax", [("X", x)], outputs=["Y"])
        self.assertResponse(result, "masked_softmax", ["Y"], [x.shape])
        want, mask = masked_softmax_ref(f64(x))
        self.assertWeights(self.get(result, "Y"), want, mask, "Y")


# --- batch_matmul. ----------------------------------------------------------


class BatchMatmulTest(KServeTestCase):

    def test_textbook_ones(self):
        # d2l 11.3: bmm(ones(2, 1, 4), ones(2, 4, 6)) is all 4.
        x, y = np.ones((2, 1, 4), np.float32), np.ones((2, 4, 6), np.float32)
        result = self.infer("batch_matmul", [("X", x), ("Y", y)])
        self.assertResponse(result, "batch_matmul", ["Z"], [(2, 1, 6)])
        np.testing.assert_array_equal(result.as_numpy("Z"),
                                      np.full((2, 1, 6), 4.0, np.float32))

    def test_random(self):
        for n, m, k, p in ((3, 5, 7, 4), (1, 1, 1, 1), (4, 16, 33, 9)):
            with self.subTest(shape=(n, m, k, p)):
                x, y = self.randn(n, m, k), self.randn(n, k, p)
                result = self.infer("batch_matmul", [("X", x), ("Y", y)],
                                    outputs=["Z"])
                self.assertResponse(result, "batch_matmul", ["Z"], [(n, m, p)])
                self.assertClose(self.get(result, "Z"),
                                 batch_matmul_ref(x, y), atol=1e-5,
                                 rtol=OUT_RTOL, what="Z")

    def test_explicit_version(self):
        x, y = self.randn(2, 3, 4), self.randn(2, 4, 2)
        result = self.infer("batch_matmul", [("X", x), ("Y", y)], version="1")
        self.assertClose(self.get(result, "Z"), batch_matmul_ref(x, y),
                         atol=1e-5, rtol=OUT_RTOL, what="Z")


# --- dot_product_attention. -------------------------------------------------


class DotProductAttentionTest(KServeTestCase):
    MODEL = "dot_product_attention"

    def inputs(self, q, k, v, valid_lens=None, lens_dtype=np.int32):
        inputs = [("queries", q), ("keys", k), ("values", v)]
        if valid_lens is not None:
            inputs.append(("valid_lens", np.asarray(valid_lens, lens_dtype)))
        return inputs

    def check(self, q, k, v, valid_lens=None, outputs=("output",
                                                        "attention_weights")):
        """Requests `outputs` (None: none named) and checks what comes back."""
        result = self.infer(self.MODEL, self.inputs(q, k, v, valid_lens),
                            outputs=None if outputs is None else list(outputs))
        B, Lq, _ = q.shape
        Lk, dv = v.shape[1], v.shape[2]
        names = ["output"] if outputs is None else list(outputs)
        shapes = {"output": (B, Lq, dv), "attention_weights": (B, Lq, Lk)}
        self.assertResponse(result, self.MODEL, names,
                            [shapes[n] for n in names])
        want_out, want_w, mask = attention_ref(q, k, v, valid_lens)
        got = {}
        if "output" in names:
            got["output"] = self.get(result, "output")
            self.assertClose(got["output"], want_out, atol=OUT_ATOL,
                             rtol=OUT_RTOL, what="output")
            empty = ~mask.any(-1)  # rows with valid length 0: exactly 0
            self.assertTrue(np.all(got["output"][empty] == 0.0),
                            "output rows of valid length 0 are not 0")
        if "attention_weights" in names:
            got["attention_weights"] = self.get(result, "attention_weights")
            self.assertWeights(got["attention_weights"], want_w, mask,
                               "attention_weights")
        return got

    def test_textbook_toy(self):
        # d2l 11.3.2.2: queries (2,1,2), keys (2,10,2), values (2,10,4),
        # valid_lens [2, 6].
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        got = self.check(q, k, v, [2, 6])
        w = got["attention_weights"]
        self.assertTrue(np.all(w[0, 0, 2:] == 0.0), w[0, 0])
        self.assertTrue(np.all(w[1, 0, 6:] == 0.0), w[1, 0])
        self.assertTrue(np.all(w[0, 0, :2] > 0.0), w[0, 0])
        self.assertTrue(np.all(w[1, 0, :6] > 0.0), w[1, 0])

    def test_lengths_per_batch_with_zero(self):
        self.check(self.randn(3, 2, 4), self.randn(3, 7, 4),
                   self.randn(3, 7, 3), [0, 3, 7])

    def test_lengths_per_row_with_zero(self):
        self.check(self.randn(3, 4, 3), self.randn(3, 5, 3),
                   self.randn(3, 5, 2),
                   [[5, 0, 2, 1], [3, 3, 0, 5], [0, 0, 0, 0]])

    def test_int64_lengths(self):
        # The server takes INT64 valid_lens too (inference_service.h).
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        result = self.infer(self.MODEL, self.inputs(q, k, v, [2, 6], np.int64),
                            outputs=["attention_weights"])
        _, want_w, mask = attention_ref(q, k, v, [2, 6])
        self.assertWeights(self.get(result, "attention_weights"), want_w, mask)

    def test_no_outputs_requested_gives_just_output(self):
        self.check(self.randn(4, 6, 8), self.randn(4, 9, 8),
                   self.randn(4, 9, 5), outputs=None)

    def test_requested_outputs_order(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 6)
        for outputs in (("attention_weights", "output"),
                        ("output", "attention_weights"),
                        ("output",), ("attention_weights",)):
            with self.subTest(outputs=outputs):
                self.check(q, k, v, [[1, 5, 3], [0, 2, 4]], outputs=outputs)

    def test_square_and_single(self):
        self.check(self.randn(1, 1, 1), self.randn(1, 1, 1),
                   self.randn(1, 1, 1))
        self.check(self.randn(5, 8, 16), self.randn(5, 8, 16),
                   self.randn(5, 8, 16), [8, 1, 4, 7, 2])

    def test_concurrent_requests(self):
        # Many requests in flight at once (with --batching they meet in the
        # dynamic batcher): same feature sizes, batch 1..3, every form of
        # valid_lens, weights for some. Each answer must be its own.
        Lq, Lk, d, dv = 3, 6, 4, 5
        cases, done = [], threading.Semaphore(0)
        for i in range(24):
            B = 1 + i % 3
            q, k, v = self.randn(B, Lq, d), self.randn(B, Lk, d), self.randn(B, Lk, dv)
            lens = (None if i % 3 == 0 else
                    self.rng.integers(0, Lk + 1, size=B) if i % 3 == 1 else
                    self.rng.integers(0, Lk + 1, size=(B, Lq)))
            outputs = (["output", "attention_weights"] if i % 2 else ["output"])
            case = {"args": (q, k, v, lens), "outputs": outputs}

            def callback(result, error, case=case):
                case["result"], case["error"] = result, error
                done.release()

            self.client.async_infer(
                self.MODEL,
                [make_input(n, a) for n, a in self.inputs(q, k, v, lens)],
                callback,
                outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                client_timeout=DEADLINE_S)
            cases.append(case)
        for _ in cases:
            self.assertTrue(done.acquire(timeout=DEADLINE_S + 5),
                            "an async_infer never called back")
        for i, case in enumerate(cases):
            with self.subTest(request=i):
                self.assertIsNone(case["error"], f"request {i}")
                q, k, v, lens = case["args"]
                want_out, want_w, mask = attention_ref(q, k, v, lens)
                result = case["result"]
                B = q.shape[0]
                self.assertResponse(
                    result, self.MODEL, case["outputs"],
                    [(B, Lq, dv), (B, Lq, Lk)][:len(case["outputs"])])
                self.assertClose(self.get(result, "output"), want_out,
                                 rtol=OUT_RTOL, what=f"request {i} output")
                if "attention_weights" in case["outputs"]:
                    self.assertWeights(self.get(result, "attention_weights"),
                                       want_w, mask,
                                       f"request {i} attention_weights")

    def test_same_numbers_as_typed_api(self):
        # The same toy case through attention.v1.AttentionService on the same
        # port: both APIs run the same kernels, so the floats are identical.
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        lens = np.array([2, 6], np.int32)
        result = self.infer(self.MODEL, self.inputs(q, k, v, lens),
                            outputs=["output", "attention_weights"])

        def tensor(a):
            return typed_pb.Tensor(shape=list(a.shape),
                                   raw=a.astype("<f4").tobytes())

        def array(t):
            return np.frombuffer(t.raw, "<f4").reshape(tuple(t.shape))

        with grpc.insecure_channel(TARGET) as channel:
            stub = typed_pb_grpc.AttentionServiceStub(channel)
            typed = stub.ScaledDotProductAttention(
                typed_pb.AttentionRequest(
                    queries=tensor(q), keys=tensor(k), values=tensor(v),
                    valid_lens=typed_pb.Lengths(shape=[2],
                                                values=lens.tolist()),
                    return_weights=True,
                    output_encoding=typed_pb.TENSOR_ENCODING_RAW),
                timeout=DEADLINE_S)
        for name, typed_array in (("output", array(typed.output)),
                                  ("attention_weights", array(typed.weights))):
            kserve_array = result.as_numpy(name)
            self.assertTrue(
                np.array_equal(kserve_array, typed_array),
                f"{name}: KServe {kserve_array.ravel()[:6]} vs typed "
                f"{typed_array.ravel()[:6]}, max diff "
                f"{np.abs(kserve_array - typed_array).max():.3g}")


# --- nadaraya_watson. -------------------------------------------------------


class NadarayaWatsonTest(KServeTestCase):
    MODEL = "nadaraya_watson"

    def textbook_data(self):
        # d2l 11.2: 50 sorted points on [0, 5), y = 2 sin x + x^0.8 + noise,
        # queries on arange(0, 5, 0.1).
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
        result = self.infer(
            self.MODEL,
            [("x_train", x_train), ("y_train", y_train), ("x_query", x_query)],
            outputs=None if outputs is None else list(outputs),
            parameters=parameters or None)
        M, N = len(x_query), len(x_train)
        names = ["y_pred"] if outputs is None else list(outputs)
        shapes = {"y_pred": (M,), "attention_weights": (M, N)}
        self.assertResponse(result, self.MODEL, names,
                            [shapes[n] for n in names])
        want_pred, want_w = nadaraya_watson_ref(
            x_train, y_train, x_query, kernel or "gaussian",
            1.0 if bandwidth is None else bandwidth)
        got = {}
        what = f"{kernel or 'default'} kernel, bandwidth {bandwidth}"
        if "y_pred" in names:
            got["y_pred"] = self.get(result, "y_pred")
            self.assertClose(got["y_pred"], want_pred, atol=OUT_ATOL,
                             rtol=OUT_RTOL, what=f"y_pred ({what})")
        if "attention_weights" in names:
            got["attention_weights"] = self.get(result, "attention_weights")
            self.assertWeights(got["attention_weights"], want_w, want_w > 0,
                               f"attention_weights ({what})")
        return got

    def test_textbook_default_gaussian(self):
        self.check(*self.textbook_data())

    def test_no_outputs_requested_gives_just_prediction(self):
        self.check(*self.textbook_data(), outputs=None)

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
        # Query 10 is beyond every training point's reach for boxcar and
        # epanechnikov: zero weights and prediction exactly 0.
        x_train = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
        y_train = np.array([1.0, -2.0, 3.0, 5.0], np.float32)
        x_query = np.array([0.5, 10.0, 2.25], np.float32)
        for kernel in ("boxcar", "epanechnikov"):
            with self.subTest(kernel=kernel):
                got = self.check(x_train, y_train, x_query, kernel=kernel)
                self.assertEqual(got["y_pred"][1], 0.0)
                self.assertTrue(np.all(got["attention_weights"][1] == 0.0))

    def test_constant_kernel_is_the_mean(self):
        x_train, y_train, x_query = self.textbook_data()
        got = self.check(x_train, y_train, x_query, kernel="constant")
        self.assertClose(got["y_pred"],
                         np.full(len(x_query), f64(y_train).mean()),
                         atol=OUT_ATOL, what="constant kernel prediction")


# --- Errors. ----------------------------------------------------------------


class ErrorTest(KServeTestCase):

    def assertInvalid(self, model, inputs, names, outputs=None,
                      parameters=None):
        """The call fails with INVALID_ARGUMENT and a message naming `names`
        (a name, or a tuple of names of which the message names at least one:
        when two inputs disagree, either is to blame).

        `inputs`: [(name, array)] or InferInput objects."""
        if isinstance(names, str):
            names = (names,)
        tensors = [t if isinstance(t, grpcclient.InferInput)
                   else make_input(*t) for t in inputs]
        requested = (None if outputs is None else
                     [grpcclient.InferRequestedOutput(n) for n in outputs])
        with self.assertRaises(InferenceServerException) as caught:
            self.client.infer(model, tensors, outputs=requested,
                              parameters=parameters,
                              client_timeout=DEADLINE_S)
        error = caught.exception
        self.assertEqual(error.status(), "StatusCode.INVALID_ARGUMENT",
                         f"{model}: {error.status()}: {error.message()}")
        pattern = "|".join(rf"\b{re.escape(n)}\b" for n in names)
        self.assertRegex(error.message(), pattern,
                         f"{model}: message does not name {' or '.join(names)}")
        return error.message()

    def attention_inputs(self, d_keys=2):
        return [("queries", self.randn(2, 1, 2)),
                ("keys", self.randn(2, 10, d_keys)),
                ("values", self.randn(2, 10, 4))]

    def test_unknown_model(self):
        with self.assertRaises(InferenceServerException) as caught:
            self.client.infer("no_such_model", [make_input("X", self.randn(1))],
                              client_timeout=DEADLINE_S)
        self.assertIn("no_such_model", caught.exception.message())

    def test_unknown_version(self):
        with self.assertRaises(InferenceServerException):
            self.client.infer(
                "batch_matmul",
                [make_input("X", self.randn(1, 2, 2)),
                 make_input("Y", self.randn(1, 2, 2))],
                model_version="2", client_timeout=DEADLINE_S)

    def test_shape_and_data_disagree(self):
        # 24 floats sent, shape says 30.
        x = make_input("X", self.randn(2, 3, 4))
        x.set_shape([2, 3, 5])
        self.assertInvalid("masked_softmax", [x], "X")

    def test_shape_and_data_disagree_in_batch_matmul(self):
        y = make_input("Y", self.randn(2, 4, 6))
        y.set_shape([2, 4, 5])
        self.assertInvalid("batch_matmul", [("X", self.randn(2, 3, 4)), y],
                           "Y")

    def test_wrong_rank(self):
        self.assertInvalid("masked_softmax", [("X", self.randn(3, 4))], "X")

    def test_wrong_rank_in_batch_matmul(self):
        self.assertInvalid("batch_matmul", [("X", self.randn(3, 4)),
                                            ("Y", self.randn(2, 4, 5))], "X")

    def test_wrong_datatype(self):
        self.assertInvalid("masked_softmax",
                           [("X", self.randn(1, 2, 3).astype(np.float64))],
                           "X")

    def test_nan_input(self):
        x = self.randn(2, 2, 4)
        x[1, 0, 2] = np.nan
        self.assertInvalid("masked_softmax", [("X", x)], "X")

    def test_nan_in_attention_values(self):
        inputs = self.attention_inputs()
        inputs[2][1][0, 3, 1] = np.nan
        self.assertInvalid("dot_product_attention", inputs, "values")

    def test_inf_in_nadaraya_watson(self):
        self.assertInvalid(
            "nadaraya_watson",
            [("x_train", np.array([0.0, 1.0, np.inf], np.float32)),
             ("y_train", np.array([0.0, 1.0, 2.0], np.float32)),
             ("x_query", np.array([0.5], np.float32))], "x_train")

    def test_keys_depth_differs_from_queries(self):
        self.assertInvalid("dot_product_attention",
                           self.attention_inputs(d_keys=3), "keys")

    def test_inner_dims_differ_in_batch_matmul(self):
        self.assertInvalid("batch_matmul", [("X", self.randn(2, 3, 4)),
                                            ("Y", self.randn(2, 5, 6))],
                           ("X", "Y"))

    def test_missing_input(self):
        self.assertInvalid("batch_matmul", [("X", self.randn(2, 3, 4))], "Y")

    def test_unknown_input(self):
        self.assertInvalid("masked_softmax", [("X", self.randn(1, 2, 3)),
                                              ("W", self.randn(1, 2, 3))], "W")

    def test_unknown_output_requested(self):
        self.assertInvalid("masked_softmax", [("X", self.randn(1, 2, 3))],
                           "Z", outputs=["Z"])

    def test_length_above_keys(self):
        self.assertInvalid(
            "dot_product_attention",
            self.attention_inputs() + [("valid_lens",
                                        np.array([2, 11], np.int32))],
            "valid_lens")

    def test_lengths_of_wrong_shape(self):
        self.assertInvalid(
            "masked_softmax",
            [("X", self.randn(2, 3, 4)),
             ("valid_lens", np.array([1, 2, 3], np.int32))], "valid_lens")

    def test_scalar_lengths(self):
        # Shape [] once read as "no valid lengths" (fuzz/kserve_infer).
        self.assertInvalid(
            "dot_product_attention",
            self.attention_inputs() + [("valid_lens",
                                        np.array(1, np.int32))],
            "valid_lens")

    def test_lengths_of_wrong_datatype(self):
        self.assertInvalid(
            "masked_softmax",
            [("X", self.randn(2, 3, 4)),
             ("valid_lens", np.array([1, 2], np.float32))], "valid_lens")

    def test_train_lengths_differ(self):
        self.assertInvalid(
            "nadaraya_watson",
            [("x_train", np.array([0.0, 1.0, 2.0], np.float32)),
             ("y_train", np.array([0.0, 1.0], np.float32)),
             ("x_query", np.array([0.5], np.float32))], ("y_train", "x_train"))

    def test_unknown_kernel(self):
        self.assertInvalid(
            "nadaraya_watson",
            [("x_train", np.array([0.0, 1.0], np.float32)),
             ("y_train", np.array([0.0, 1.0], np.float32)),
             ("x_query", np.array([0.5], np.float32))], "kernel",
            parameters={"kernel": "triangle"})


# --- Models of the repository (mode "repository" only). -------------------

def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32 tensors only)."""
    import json
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(
            data[8 + size + begin:8 + size + end], np.float32).reshape(info["shape"])
    return tensors


class RepositoryTest(KServeTestCase):
    def weights(self, model):
        return read_safetensors(os.path.join(REPOSITORY, model,
                                             "weights.safetensors"))

    def test_additive_attention_uses_repository_weights(self):
        w = self.weights("additive_attention")
        h, q_size = w["W_q"].shape
        k_size = w["W_k"].shape[1]
        queries, keys = self.randn(2, 3, q_size), self.randn(2, 5, k_size)
        values = self.randn(2, 5, 4)
        lens = np.array([2, 5], np.int32)
        result = self.infer("additive_attention",
                            [("queries", queries), ("keys", keys),
                             ("values", values), ("valid_lens", lens)],
                            outputs=["output", "attention_weights"])
        # numpy reference, float64: w_v . tanh(W_q q + W_k k), masked softmax.
        qf = queries.astype(np.float64) @ w["W_q"].T.astype(np.float64)
        kf = keys.astype(np.float64) @ w["W_k"].T.astype(np.float64)
        scores = np.tanh(qf[:, :, None, :] + kf[:, None, :, :]) @ w["w_v"].astype(np.float64)
        weights = np.zeros_like(scores)
        for b in range(2):
            s = scores[b, :, :lens[b]]
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            weights[b, :, :lens[b]] = e / e.sum(axis=-1, keepdims=True)
        np.testing.assert_allclose(result.as_numpy("attention_weights"), weights,
                                   atol=1e-5)
        np.testing.assert_allclose(result.as_numpy("output"),
                                   weights @ values.astype(np.float64), atol=1e-4)
        self.assertTrue(np.all(result.as_numpy("attention_weights")[0, :, 2:] == 0))

    def nw_reference(self, x, y, xq, w):
        d = (xq[:, None].astype(np.float64) - x[None, :]) * w
        s = -d * d / 2
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)) @ y.astype(np.float64)

    def textbook(self):
        x = np.sort(self.rng.uniform(0, 5, 50)).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8 + self.rng.normal(0, 0.5, 50)).astype(np.float32)
        return x, y, np.linspace(0, 5, 20, dtype=np.float32)

    def test_fitted_bandwidth_from_repository(self):
        w = float(self.weights("nadaraya_watson_fitted")["bandwidth"][0])
        x, y, xq = self.textbook()
        result = self.infer("nadaraya_watson_fitted",
                            [("x_train", x), ("y_train", y), ("x_query", xq)],
                            outputs=["y_pred"])
        np.testing.assert_allclose(result.as_numpy("y_pred"),
                                   self.nw_reference(x, y, xq, w), atol=1e-4)

    def test_fit_saved_by_typed_api_is_served(self):
        import grpc
        x, y, xq = self.textbook()
        name = f"fitted_{MODE}_{SEED}"
        with grpc.insecure_channel(TARGET) as channel:
            stub = typed_pb_grpc.AttentionServiceStub(channel)
            fit = stub.FitBandwidth(typed_pb.FitBandwidthRequest(
                x_train=typed_pb.Tensor(shape=[50], values=x.tolist()),
                y_train=typed_pb.Tensor(shape=[50], values=y.tolist()),
                save_as=name), timeout=DEADLINE_S)
        self.assertIn(name, [m.name for m in
                             self.client.get_model_repository_index().models])
        saved = self.weights(name)
        self.assertEqual(np.float32(saved["bandwidth"][0]), np.float32(fit.bandwidth))
        np.testing.assert_array_equal(saved["x_train"], x)
        np.testing.assert_array_equal(saved["y_train"], y)
        # The saved model holds its training set: the textbook's
        # net(x_test, keys, values) is a call with x_query alone.
        result = self.infer(name, [("x_query", xq)], outputs=["y_pred"])
        np.testing.assert_allclose(
            result.as_numpy("y_pred"),
            self.nw_reference(x, y, xq, float(saved["bandwidth"][0])), atol=1e-4)


if not REPOSITORY:
    del RepositoryTest  # runs in the "repository" mode of the runner only


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(
        sys.modules[__name__])
    print(f"tritonclient_test.py: target {TARGET}, mode {MODE}, seed {SEED} "
          f"(ATTNSERVE_TEST_SEED)")
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    # Tests, not subtests: a test with three failing subtests is one failure.
    failed = len({getattr(test, "test_case", test).id()
                  for test, _ in result.failures + result.errors})
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1




class PriorityAndTimeoutTest(KServeTestCase):
    """Triton's per-request priority and timeout (microseconds) are honoured
    parameters: a request that carries them is served as any other (their
    effect on the queue is tested with the core's fake clock and a blocked
    pool in server/execution/call_runner_test.cc)."""

    def test_priority_and_timeout_are_accepted(self):
        x, y = self.randn(2, 3, 4), self.randn(2, 4, 5)
        result = self.client.infer(
            "batch_matmul", [make_input("X", x), make_input("Y", y)],
            priority=1, timeout=10_000_000, client_timeout=DEADLINE_S)
        self.assertClose(self.get(result, "Z"), batch_matmul_ref(x, y))

# --- Streaming (ModelStreamInfer). -------------------------------------------


class StreamTest(KServeTestCase):
    """tritonclient's start_stream / async_stream_infer: many requests on one
    stream, answers matched by id (completion order is free), an error in
    one request reported for it alone while the stream goes on."""

    def test_many_requests_one_stream(self):
        import queue
        answers = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: answers.put((result, error)),
            stream_timeout=DEADLINE_S)
        try:
            sent = {}
            for i in range(24):
                b, lq, lk, d, v = 2, 1 + i % 5, 3 + i % 7, 4, 3
                q, k, vals = self.randn(b, lq, d), self.randn(b, lk, d), self.randn(b, lk, v)
                lens = self.rng.integers(0, lk + 1, size=(b,)).astype(np.int32)
                request_id = f"req-{i}"
                sent[request_id] = attention_ref(q, k, vals, lens)[0]
                self.client.async_stream_infer(
                    "dot_product_attention",
                    [make_input("queries", q), make_input("keys", k),
                     make_input("values", vals), make_input("valid_lens", lens)],
                    request_id=request_id,
                    outputs=[grpcclient.InferRequestedOutput("output")])
                if i == 10:
                    # A bad request in the middle: keys of another depth.
                    self.client.async_stream_infer(
                        "dot_product_attention",
                        [make_input("queries", q),
                         make_input("keys", self.randn(b, lk, d + 1)),
                         make_input("values", vals)],
                        request_id="bad")
            seen, errors = {}, []
            for _ in range(len(sent) + 1):
                result, error = answers.get(timeout=DEADLINE_S)
                if error is not None:
                    errors.append(str(error))
                    continue
                request_id = result.get_response().id
                self.assertNotIn(request_id, seen, "answered twice")
                seen[request_id] = self.get(result, "output")
        finally:
            self.client.stop_stream()
        self.assertEqual(set(seen), set(sent), "every good request answered once")
        for request_id, want in sent.items():
            self.assertClose(seen[request_id], want, what=request_id)
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("INVALID_ARGUMENT", errors[0])
        self.assertIn("keys", errors[0])

    def test_unknown_model_on_a_stream_is_an_error_message(self):
        import queue
        answers = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: answers.put((result, error)))
        try:
            self.client.async_stream_infer(
                "no_such_model", [make_input("X", self.randn(1, 1, 1))],
                request_id="x")
            self.client.async_stream_infer(
                "batch_matmul", [make_input("X", np.ones((1, 2, 3), np.float32)),
                                 make_input("Y", np.ones((1, 3, 4), np.float32))],
                request_id="y")
            got = [answers.get(timeout=DEADLINE_S) for _ in range(2)]
        finally:
            self.client.stop_stream()
        errors = [str(e) for r, e in got if e is not None]
        results = [r for r, e in got if e is None]
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("no_such_model", errors[0])
        self.assertEqual(len(results), 1)
        self.assertEqual(results[0].get_response().id, "y")
        self.assertClose(self.get(results[0], "Z"), np.full((1, 2, 4), 3.0))

# --- Every model under concurrency (the batcher in mode "batching"). ---------


class ConcurrentEveryModelTest(KServeTestCase):
    """Many ragged requests of each model in flight at once: with --batching
    they meet in the dynamic batcher (padded and masked, or concatenated for
    queries against one training set); each answer must be its own."""

    def run_concurrently(self, model, requests, outputs):
        """requests: [[(name, array)]]; returns the results in order."""
        done = threading.Semaphore(0)
        answers = [None] * len(requests)
        for i, inputs in enumerate(requests):
            def callback(result, error, i=i):
                answers[i] = (result, error)
                done.release()
            self.client.async_infer(
                model, [make_input(n, a) for n, a in inputs], callback,
                outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                client_timeout=DEADLINE_S)
        for _ in requests:
            self.assertTrue(done.acquire(timeout=DEADLINE_S + 5),
                            "an async_infer never called back")
        for i, (result, error) in enumerate(answers):
            self.assertIsNone(error, f"{model} request {i}")
        return [result for result, _ in answers]

    def test_masked_softmax(self):
        requests = []
        for i in range(16):
            b, q, k = 1 + i % 3, 1 + i % 5, 2 + i % 7
            x = self.randn(b, q, k) * 3
            lens = (self.rng.integers(0, k + 1, size=(b,)) if i % 2 else
                    self.rng.integers(0, k + 1, size=(b, q))).astype(np.int32)
            requests.append([("X", x), ("valid_lens", lens)])
        results = self.run_concurrently("masked_softmax", requests, ["Y"])
        for i, (inputs, result) in enumerate(zip(requests, results)):
            want, mask = masked_softmax_ref(inputs[0][1], inputs[1][1])
            self.assertWeights(self.get(result, "Y"), want, mask, f"request {i}")

    def test_batch_matmul(self):
        requests = [[("X", self.randn(1 + i % 3, 1 + i % 6, 5)),
                     ("Y", self.randn(1 + i % 3, 5, 4))] for i in range(16)]
        results = self.run_concurrently("batch_matmul", requests, ["Z"])
        for i, (inputs, result) in enumerate(zip(requests, results)):
            want = batch_matmul_ref(inputs[0][1], inputs[1][1])
            self.assertClose(self.get(result, "Z"), want,
                             atol=OUT_ATOL, rtol=OUT_RTOL, what=f"request {i}")

    def test_nadaraya_watson_against_one_training_set(self):
        x = np.sort(self.rng.uniform(0, 5, 50)).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8).astype(np.float32)
        requests = [[("x_train", x), ("y_train", y),
                     ("x_query", self.rng.uniform(0, 5, 1 + i % 9).astype(np.float32))]
                    for i in range(16)]
        results = self.run_concurrently("nadaraya_watson", requests,
                                        ["y_pred", "attention_weights"])
        for i, (inputs, result) in enumerate(zip(requests, results)):
            want, weights = nadaraya_watson_ref(x, y, inputs[2][1])
            self.assertClose(self.get(result, "y_pred"), want, what=f"request {i}")
            self.assertClose(self.get(result, "attention_weights"), weights,
                             atol=WEIGHT_ATOL, what=f"request {i} weights")


# --- Live model control (mode "repository": --model_control_mode=explicit). --


class ModelControlTest(KServeTestCase):
    """RepositoryModelLoad / RepositoryModelUnload: a folder added while
    serving loads, serves, unloads under load (every request in flight
    answered: its result, or NOT_FOUND once unloaded; none lost) and loads
    again; the index shows each state."""

    COPY = "additive_live"

    def state(self, name):
        for model in self.client.get_model_repository_index().models:
            if model.name == name:
                return model.state, model.reason
        return None

    def additive_inputs(self, w):
        q_size, k_size = w["W_q"].shape[1], w["W_k"].shape[1]
        return [("queries", self.randn(2, 3, q_size)),
                ("keys", self.randn(2, 5, k_size)),
                ("values", self.randn(2, 5, 4))]

    def test_load_unload_under_load(self):
        import shutil
        folder = os.path.join(REPOSITORY, self.COPY)
        shutil.copytree(os.path.join(REPOSITORY, "additive_attention"), folder)
        config = os.path.join(folder, "config.pbtxt")
        with open(config) as f:
            text = f.read().replace('"additive_attention"', f'"{self.COPY}"', 1)
        with open(config, "w") as f:
            f.write(text)
        try:
            self.assertEqual(self.state(self.COPY), ("UNAVAILABLE", "not loaded"))
            self.assertFalse(self.client.is_model_ready(self.COPY))
            self.client.load_model(self.COPY)
            self.assertEqual(self.state(self.COPY)[0], "READY")
            self.assertTrue(self.client.is_model_ready(self.COPY))
            inputs = self.additive_inputs(read_safetensors(
                os.path.join(folder, "weights.safetensors")))
            want = self.get(self.infer("additive_attention", inputs, ["output"]),
                            "output")
            self.assertClose(self.get(self.infer(self.COPY, inputs, ["output"]),
                                      "output"), want, what="loaded copy")

            # Under load: 4 threads infer while the model is unloaded and
            # loaded again three times.
            stop = threading.Event()
            outcomes = []
            lock = threading.Lock()

            def client_loop():
                while not stop.is_set():
                    try:
                        got = self.get(self.infer(self.COPY, inputs, ["output"]),
                                       "output")
                        np.testing.assert_allclose(got, want, atol=1e-6)
                        outcome = "ok"
                    except InferenceServerException as e:
                        outcome = e.status()
                        if "not served" not in e.message():
                            outcome += ": " + e.message()
                    with lock:
                        outcomes.append(outcome)

            threads = [threading.Thread(target=client_loop) for _ in range(4)]
            for t in threads:
                t.start()
            try:
                for _ in range(3):
                    time.sleep(0.1)
                    self.client.unload_model(self.COPY)
                    time.sleep(0.1)
                    self.client.load_model(self.COPY)
                time.sleep(0.1)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=DEADLINE_S)
            kinds = set(outcomes)
            self.assertIn("ok", kinds)
            self.assertLessEqual(kinds, {"ok", "StatusCode.NOT_FOUND"}, kinds)

            self.client.unload_model(self.COPY)
            self.assertFalse(self.client.is_model_ready(self.COPY))
            # UNLOADING until the server has let go of the last call's hold
            # (microseconds after its answer was sent).
            for _ in range(50):
                if self.state(self.COPY)[0] != "UNLOADING":
                    break
                time.sleep(0.02)
            self.assertEqual(self.state(self.COPY), ("UNAVAILABLE", "unloaded"))
            # tritonclient does not send `ready`; its generated stub does.
            from tritonclient.grpc import service_pb2, service_pb2_grpc
            with grpc.insecure_channel(TARGET) as channel:
                ready_only = service_pb2_grpc.GRPCInferenceServiceStub(
                    channel).RepositoryIndex(
                        service_pb2.RepositoryIndexRequest(ready=True),
                        timeout=DEADLINE_S)
            names = [m.name for m in ready_only.models]
            self.assertNotIn(self.COPY, names)
            self.assertIn("additive_attention", names)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            try:
                self.client.unload_model(self.COPY)
            except InferenceServerException:
                pass

    def test_refusals(self):
        def code(call):
            with self.assertRaises(InferenceServerException) as raised:
                call()
            return raised.exception.status(), raised.exception.message()
        status, message = code(lambda: self.client.unload_model("batch_matmul"))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("built in", message)
        status, message = code(lambda: self.client.load_model("no_such_folder"))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        status, message = code(lambda: self.client.load_model("../x"))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        status, message = code(lambda: self.client.load_model(
            "additive_attention", config='{"backend": "x"}'))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("config", message)
        self.client.load_model("batch_matmul")  # built in: nothing to do
        self.assertIn("model_repository",
                      self.client.get_server_metadata().extensions)


class ModelControlOffTest(KServeTestCase):
    """Without --model_control_mode=explicit the models stay as loaded."""

    def test_load_is_refused_naming_the_flag(self):
        with self.assertRaises(InferenceServerException) as raised:
            self.client.unload_model("batch_matmul")
        self.assertEqual(raised.exception.status(),
                         "StatusCode.FAILED_PRECONDITION")
        self.assertIn("--model_control_mode=explicit",
                      raised.exception.message())


if REPOSITORY:
    del ModelControlOffTest
else:
    del ModelControlTest

if __name__ == "__main__":
    sys.exit(main())
