"""A Python client of attnserve, written from proto/attention/v1/attention.proto.

Calls every RPC of attention.v1.AttentionService on a running server and checks
each answer against the small float64 numpy reference below (obvious loops
and formulas, nothing shared with the C++ code). The semantics checked are the
"decided once" list of docs/api.md: masked positions get exactly zero weight, a
valid length of 0 gives an all-zero row, causal masks are top-left aligned,
multi-head valid lengths apply to every head.

Needs the generated stubs (attention/v1/attention_pb2*.py) on PYTHONPATH and
the server's address in ATTNSERVE_TARGET (host:port); run_client_test.sh sets
both up. Plain unittest; the last line printed is "N passed, M failed".
"""

import math
import os
import sys
import unittest

import grpc
import numpy as np

from attention.v1 import attention_pb2 as pb
from attention.v1 import attention_pb2_grpc as pb_grpc

TARGET = os.environ.get("ATTNSERVE_TARGET", "127.0.0.1:8001")
# Every test draws its data from this seed (fixed, so a failure replays).
SEED = int(os.environ.get("ATTNSERVE_TEST_SEED", "20240611"))
DEADLINE_S = 20.0

# Tolerances against the float64 reference.
WEIGHT_ATOL = 1e-5
OUT_ATOL = 1e-4
OUT_RTOL = 1e-4

VALUES = pb.TENSOR_ENCODING_VALUES
RAW = pb.TENSOR_ENCODING_RAW


# --------------------------------------------------------------------------
# Wire helpers.


def to_tensor(array, encoding="values"):
    """A numpy array as an attention.v1.Tensor, as `values` or `raw`."""
    array = np.asarray(array, dtype=np.float32)
    tensor = pb.Tensor(shape=list(array.shape))
    if encoding == "values":
        tensor.values.extend(array.ravel().tolist())
    elif encoding == "raw":
        tensor.raw = array.astype("<f4").tobytes()
    else:
        raise ValueError(encoding)
    return tensor


def to_lengths(lens):
    lens = np.asarray(lens, dtype=np.int32)
    return pb.Lengths(shape=list(lens.shape), values=lens.ravel().tolist())


def from_tensor(tensor, expected_encoding):
    """The array in an attention.v1.Tensor; checks which field carries it."""
    shape = tuple(tensor.shape)
    count = int(np.prod(shape)) if shape else 0
    if expected_encoding == RAW:
        assert len(tensor.values) == 0, "RAW requested but `values` is set"
        assert len(tensor.raw) == 4 * count, (
            f"raw holds {len(tensor.raw)} bytes for shape {shape}")
        data = np.frombuffer(tensor.raw, dtype="<f4")
    else:
        assert len(tensor.raw) == 0, "VALUES requested but `raw` is set"
        assert len(tensor.values) == count, (
            f"values holds {len(tensor.values)} floats for shape {shape}")
        data = np.asarray(tensor.values, dtype=np.float32)
    return data.astype(np.float64).reshape(shape)


def f32(array):
    """What the server sees: the input rounded to float32, back in float64."""
    return np.asarray(array, dtype=np.float32).astype(np.float64)


# --------------------------------------------------------------------------
# The float64 reference.


def row_masks(B, Q, K, valid_lens=None, causal=False):
    """Boolean (B, Q, K): True where position k of row (b, q) takes part."""
    mask = np.ones((B, Q, K), dtype=bool)
    if valid_lens is not None:
        lens = np.asarray(valid_lens)
        if lens.ndim == 1:
            lens = np.repeat(lens[:, None], Q, axis=1)
        for b in range(B):
            for q in range(Q):
                mask[b, q, lens[b, q]:] = False
    if causal:
        for q in range(Q):
            mask[:, q, q + 1:] = False
    return mask


def masked_softmax_ref(scores, mask):
    """Softmax over the last axis of the True positions; the rest exactly 0.

    A row without any True position is all zero.
    """
    out = np.zeros_like(scores, dtype=np.float64)
    flat_s = scores.reshape(-1, scores.shape[-1])
    flat_m = mask.reshape(-1, mask.shape[-1])
    flat_o = out.reshape(-1, out.shape[-1])
    for r in range(flat_s.shape[0]):
        keep = flat_m[r]
        if not keep.any():
            continue
        s = flat_s[r, keep]
        e = np.exp(s - s.max())
        flat_o[r, keep] = e / e.sum()
    return out


def attention_ref(q, k, v, valid_lens=None, causal=False, scale=None,
                  score="dot"):
    """Returns (output, weights) for (B, L, d) or (B, H, L, d) inputs."""
    q, k, v = f32(q), f32(k), f32(v)
    if q.ndim == 4:
        B, H = q.shape[:2]
        outs, weights = [], []
        for h in range(H):
            o, w = attention_ref(q[:, h], k[:, h], v[:, h], valid_lens, causal,
                                 scale, score)
            outs.append(o)
            weights.append(w)
        return np.stack(outs, axis=1), np.stack(weights, axis=1)
    B, Lq, d = q.shape
    Lk = k.shape[1]
    if score == "dot":
        s = (1.0 / math.sqrt(d)) if scale is None else scale
        scores = s * np.einsum("bqd,bkd->bqk", q, k)
    else:  # gaussian
        s = 1.0 if scale is None else scale
        diff = q[:, :, None, :] - k[:, None, :, :]
        scores = s * -(diff ** 2).sum(-1) / 2
    w = masked_softmax_ref(scores, row_masks(B, Lq, Lk, valid_lens, causal))
    return w @ v, w


def additive_ref(q, k, v, w_q, w_k, w_v, valid_lens=None):
    q, k, v, w_q, w_k, w_v = map(f32, (q, k, v, w_q, w_k, w_v))
    fq = q @ w_q.T  # (B, Lq, h)
    fk = k @ w_k.T  # (B, Lk, h)
    features = np.tanh(fq[:, :, None, :] + fk[:, None, :, :])
    scores = features @ w_v  # (B, Lq, Lk)
    B, Lq, Lk = scores.shape
    w = masked_softmax_ref(scores, row_masks(B, Lq, Lk, valid_lens))
    return w @ v, w


def nadaraya_watson_ref(x_train, y_train, x_query, kernel, bandwidth=1.0):
    xt, yt, xq = f32(x_train), f32(y_train), f32(x_query)
    if xt.ndim == 1:
        xt, xq = xt[:, None], xq[:, None]
    dist = np.sqrt(((xq[:, None, :] - xt[None, :, :]) ** 2).sum(-1))  # (m, n)
    u = bandwidth * dist
    if kernel == "gaussian":
        logits = -u ** 2 / 2
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        w = e / e.sum(axis=1, keepdims=True)
    elif kernel == "boxcar":
        mass = (u < 1).astype(np.float64)
        total = mass.sum(axis=1, keepdims=True)
        w = np.divide(mass, total, out=np.zeros_like(mass), where=total > 0)
    else:
        raise ValueError(kernel)
    return w @ yt, w


def loo_loss_and_grad(x, y, w):
    """L(w) = sum_i (yhat_i - y_i)^2, yhat_i attending over every j != i."""
    x, y = f32(x), f32(y)
    d2 = (x[:, None] - x[None, :]) ** 2
    logits = -(w ** 2) * d2 / 2
    np.fill_diagonal(logits, -np.inf)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    yhat = a @ y
    loss = ((yhat - y) ** 2).sum()
    ds = -w * d2  # d logits / dw
    np.fill_diagonal(ds, 0.0)
    da = a * (ds - (a * ds).sum(axis=1, keepdims=True))
    grad = (2 * (yhat - y) * (da @ y)).sum()
    return loss, grad


def fit_ref(x, y, w0, lr, epochs):
    w, losses = float(w0), []
    for _ in range(epochs):
        loss, grad = loo_loss_and_grad(x, y, w)
        losses.append(loss)
        w -= lr * grad
    return w, losses, loo_loss_and_grad(x, y, w)[0]


# --------------------------------------------------------------------------
# The tests.


class ServerTestCase(unittest.TestCase):
    channel = None
    stub = None

    @classmethod
    def setUpClass(cls):
        cls.channel = grpc.insecure_channel(
            TARGET,
            options=[("grpc.max_receive_message_length", 64 << 20),
                     ("grpc.max_send_message_length", 64 << 20)])
        grpc.channel_ready_future(cls.channel).result(timeout=15)
        cls.stub = pb_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()

    def setUp(self):
        self.rng = np.random.default_rng(SEED)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def call(self, method, request):
        response = getattr(self.stub, method)(request, timeout=DEADLINE_S)
        self.assertTrue(response.info.implementation,
                        f"{method}: info.implementation is empty")
        return response

    def assertClose(self, got, want, atol=OUT_ATOL, rtol=OUT_RTOL, what=""):
        self.assertEqual(got.shape, want.shape, f"{what}: shape")
        err = np.abs(got - want) - rtol * np.abs(want)
        worst = np.unravel_index(np.argmax(err), err.shape) if err.size else ()
        self.assertTrue(
            np.all(err <= atol),
            f"{what}: max |got - want| = {np.abs(got - want).max():.3g} at "
            f"{worst}: got {got[worst] if err.size else None}, "
            f"want {want[worst] if err.size else None}")

    def assertWeights(self, got, want, mask, what="weights"):
        self.assertClose(got, want, atol=WEIGHT_ATOL, rtol=0.0, what=what)
        self.assertTrue(np.all(got[~mask] == 0.0),
                        f"{what}: masked positions are not exactly 0: "
                        f"{got[~mask][got[~mask] != 0][:5]}")
        sums = got.sum(-1)
        live = mask.any(-1)
        self.assertTrue(np.allclose(sums[live], 1.0, atol=1e-5),
                        f"{what}: live rows do not sum to 1")
        self.assertTrue(np.all(sums[~live] == 0.0),
                        f"{what}: empty rows are not all zero")


class MaskedSoftmaxTest(ServerTestCase):

    def run_case(self, x, valid_lens, in_enc="values", out_enc=VALUES):
        request = pb.MaskedSoftmaxRequest(x=to_tensor(x, in_enc),
                                          output_encoding=out_enc)
        if valid_lens is not None:
            request.valid_lens.CopyFrom(to_lengths(valid_lens))
        got = from_tensor(self.call("MaskedSoftmax", request).output, out_enc)
        B, Q, K = x.shape
        mask = row_masks(B, Q, K, valid_lens)
        self.assertWeights(got, masked_softmax_ref(f32(x), mask), mask,
                           "masked softmax")
        return got

    def test_batch_lengths_with_zero(self):
        x = self.randn(3, 4, 5)
        got = self.run_case(x, [2, 0, 5])
        self.assertTrue(np.all(got[1] == 0.0), "valid length 0: rows not zero")

    def test_row_lengths_with_zero(self):
        x = self.randn(2, 3, 7)
        self.run_case(x, [[1, 0, 7], [3, 6, 0]])

    def test_no_lengths(self):
        self.run_case(self.randn(2, 2, 4), None)

    def test_textbook_masked_softmax(self):
        # d2l: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])).
        x = self.rng.random((2, 2, 4)).astype(np.float32)
        got = self.run_case(x, [2, 3])
        self.assertTrue(np.all(got[0, :, 2:] == 0.0))
        self.assertTrue(np.all(got[1, :, 3:] == 0.0))

    def test_large_rows_raw_in_raw_out(self):
        x = self.randn(4, 97, 257) * 4
        lens = self.rng.integers(0, 258, size=(4, 97))
        self.run_case(x, lens, in_enc="raw", out_enc=RAW)


class BatchMatmulTest(ServerTestCase):

    def run_case(self, n, m, k, p, enc_a="values", enc_b="values",
                 out_enc=VALUES):
        a, b = self.randn(n, m, k), self.randn(n, k, p)
        request = pb.BatchMatmulRequest(a=to_tensor(a, enc_a),
                                        b=to_tensor(b, enc_b),
                                        output_encoding=out_enc)
        got = from_tensor(self.call("BatchMatmul", request).output, out_enc)
        self.assertClose(got, f32(a) @ f32(b), atol=1e-4, rtol=1e-5,
                         what="batch matmul")

    def test_small(self):
        self.run_case(2, 3, 4, 5)

    def test_mixed_encodings(self):
        self.run_case(3, 7, 1, 9, enc_a="raw", enc_b="values", out_enc=RAW)

    def test_odd_large(self):
        self.run_case(2, 97, 257, 33, enc_a="raw", enc_b="raw")


class ScaledDotProductAttentionTest(ServerTestCase):

    def run_case(self, q, k, v, valid_lens=None, causal=False, scale=None,
                 score="dot", in_enc="values", out_enc=VALUES,
                 return_weights=True, precision=pb.PRECISION_FLOAT32,
                 atol=OUT_ATOL, weight_atol=WEIGHT_ATOL):
        request = pb.AttentionRequest(
            queries=to_tensor(q, in_enc), keys=to_tensor(k, in_enc),
            values=to_tensor(v, in_enc), causal=causal,
            score=pb.SCORE_GAUSSIAN if score == "gaussian" else
            pb.SCORE_DOT_PRODUCT,
            return_weights=return_weights, precision=precision,
            output_encoding=out_enc)
        if valid_lens is not None:
            request.valid_lens.CopyFrom(to_lengths(valid_lens))
        if scale is not None:
            request.scale = scale
        response = self.call("ScaledDotProductAttention", request)
        want_out, want_w = attention_ref(q, k, v, valid_lens, causal, scale,
                                         score)
        got_out = from_tensor(response.output, out_enc)
        self.assertClose(got_out, want_out, atol=atol, what="attention output")
        if not return_weights:
            self.assertFalse(response.HasField("weights"),
                             "weights returned without return_weights")
            return got_out, None
        got_w = from_tensor(response.weights, out_enc)
        B, Lq, Lk = q.shape[0], q.shape[-2], k.shape[-2]
        mask = row_masks(B, Lq, Lk, valid_lens, causal)
        if q.ndim == 4:
            mask = np.repeat(mask[:, None], q.shape[1], axis=1)
        self.assertClose(got_w, want_w, atol=weight_atol, rtol=0.0,
                         what="attention weights")
        self.assertTrue(np.all(got_w[~mask] == 0.0),
                        "masked attention weights are not exactly 0")
        return got_out, got_w

    def test_textbook_toy_case(self):
        # d2l 11.3: queries (2,1,2), keys (2,10,2), values (2,10,4), lens [2,6].
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        out, w = self.run_case(q, k, v, valid_lens=[2, 6])
        self.assertEqual(out.shape, (2, 1, 4))
        self.assertEqual(w.shape, (2, 1, 10))
        self.assertTrue(np.all(w[0, :, 2:] == 0.0), w[0])
        self.assertTrue(np.all(w[1, :, 6:] == 0.0), w[1])
        self.assertTrue(np.all(w[0, :, :2] > 0.0) and np.all(w[1, :, :6] > 0.0))

    def test_textbook_toy_case_raw(self):
        q, k, v = self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)
        self.run_case(q, k, v, valid_lens=[2, 6], in_enc="raw", out_enc=RAW)

    def test_zero_length_gives_zero_rows(self):
        q, k, v = self.randn(3, 4, 8), self.randn(3, 6, 8), self.randn(3, 6, 5)
        out, w = self.run_case(q, k, v, valid_lens=[0, 3, 6])
        self.assertTrue(np.all(out[0] == 0.0) and np.all(w[0] == 0.0))

    def test_row_lengths(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 3)
        self.run_case(q, k, v, valid_lens=[[0, 2, 5], [5, 1, 3]])

    def test_causal_top_left(self):
        # Lq != Lk: row i attends to keys j <= i (top-left aligned).
        q, k, v = self.randn(2, 5, 8), self.randn(2, 7, 8), self.randn(2, 7, 3)
        _, w = self.run_case(q, k, v, causal=True)
        self.assertTrue(np.all(np.triu(w[0], 1) == 0.0))
        self.assertEqual(w[0, 0, 0], 1.0)

    def test_causal_with_lengths(self):
        q, k, v = self.randn(2, 6, 4), self.randn(2, 6, 4), self.randn(2, 6, 4)
        self.run_case(q, k, v, valid_lens=[3, 0], causal=True)

    def test_multi_head_batch_lengths(self):
        q = self.randn(2, 4, 3, 8)
        k, v = self.randn(2, 4, 9, 8), self.randn(2, 4, 9, 6)
        self.run_case(q, k, v, valid_lens=[4, 9])

    def test_multi_head_row_lengths_causal_raw(self):
        q = self.randn(2, 3, 5, 8)
        k, v = self.randn(2, 3, 5, 8), self.randn(2, 3, 5, 6)
        self.run_case(q, k, v, valid_lens=[[1, 2, 0, 5, 5], [5, 4, 3, 2, 1]],
                      causal=True, in_enc="raw", out_enc=RAW)

    def test_explicit_scale(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 2)
        self.run_case(q, k, v, scale=0.3)

    def test_gaussian_score(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 2)
        self.run_case(q, k, v, valid_lens=[2, 5], score="gaussian")
        self.run_case(q, k, v, score="gaussian", scale=0.5)

    def test_without_weights(self):
        q, k, v = self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 2)
        self.run_case(q, k, v, valid_lens=[1, 4], return_weights=False)

    def test_large_blocked_path(self):
        # 2x300x300x64: above the single-thread threshold, more than one
        # 256-key block, lengths that end inside and outside the first block.
        q, k = self.randn(2, 300, 64), self.randn(2, 300, 64)
        v = self.randn(2, 300, 32)
        lens = self.rng.integers(0, 301, size=(2, 300))
        lens[0, :3] = [0, 256, 300]
        self.run_case(q, k, v, valid_lens=lens, in_enc="raw", out_enc=RAW,
                      return_weights=False)
        self.run_case(q, k, v, valid_lens=[257, 100], causal=True,
                      in_enc="raw", out_enc=RAW)

    def test_bfloat16_within_documented_bound(self):
        q, k, v = self.randn(2, 16, 32), self.randn(2, 24, 32), self.randn(2, 24, 8)
        self.run_case(q, k, v, valid_lens=[10, 24],
                      precision=pb.PRECISION_BFLOAT16, atol=2.0 ** -5,
                      weight_atol=2.0 ** -5)

    def test_float16_within_documented_bound(self):
        q, k, v = self.randn(2, 16, 32), self.randn(2, 24, 32), self.randn(2, 24, 8)
        self.run_case(q, k, v, valid_lens=[10, 24],
                      precision=pb.PRECISION_FLOAT16, atol=2.0 ** -8,
                      weight_atol=2.0 ** -8)


class AdditiveAttentionTest(ServerTestCase):

    def run_case(self, B, Lq, Lk, qd, kd, h, vd, valid_lens, in_enc="values",
                 out_enc=VALUES):
        q, k, v = self.randn(B, Lq, qd), self.randn(B, Lk, kd), self.randn(B, Lk, vd)
        w_q, w_k, w_v = self.randn(h, qd), self.randn(h, kd), self.randn(h)
        request = pb.AdditiveAttentionRequest(
            queries=to_tensor(q, in_enc), keys=to_tensor(k, in_enc),
            values=to_tensor(v, in_enc),
            weights=pb.AdditiveWeights(w_q=to_tensor(w_q, in_enc),
                                       w_k=to_tensor(w_k, in_enc),
                                       w_v=to_tensor(w_v, in_enc)),
            return_weights=True, output_encoding=out_enc)
        if valid_lens is not None:
            request.valid_lens.CopyFrom(to_lengths(valid_lens))
        response = self.call("AdditiveAttention", request)
        want_out, want_w = additive_ref(q, k, v, w_q, w_k, w_v, valid_lens)
        self.assertClose(from_tensor(response.output, out_enc), want_out,
                         what="additive output")
        self.assertWeights(from_tensor(response.weights, out_enc), want_w,
                           row_masks(B, Lq, Lk, valid_lens), "additive weights")

    def test_textbook_shapes(self):
        # d2l 11.3.2: queries (2,1,20), keys (2,10,2), values (2,10,4), h 8.
        self.run_case(2, 1, 10, 20, 2, 8, 4, [2, 6])

    def test_zero_and_row_lengths_raw(self):
        self.run_case(2, 3, 6, 5, 4, 7, 3, [[0, 6, 2], [1, 0, 3]],
                      in_enc="raw", out_enc=RAW)

    def test_no_lengths(self):
        self.run_case(3, 4, 5, 6, 6, 16, 2, None)

    def test_unknown_weights_name_is_not_found(self):
        request = pb.AdditiveAttentionRequest(
            queries=to_tensor(self.randn(1, 1, 2)),
            keys=to_tensor(self.randn(1, 2, 2)),
            values=to_tensor(self.randn(1, 2, 2)), weights_name="no-such-model")
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.AdditiveAttention(request, timeout=DEADLINE_S)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("weights_name", caught.exception.details())


class NadarayaWatsonTest(ServerTestCase):

    def run_case(self, x_train, y_train, x_query, kernel, bandwidth=None,
                 in_enc="values", out_enc=VALUES, weight_atol=WEIGHT_ATOL):
        request = pb.NadarayaWatsonRequest(
            x_train=to_tensor(x_train, in_enc), y_train=to_tensor(y_train, in_enc),
            x_query=to_tensor(x_query, in_enc),
            kernel=(pb.REGRESSION_KERNEL_GAUSSIAN if kernel == "gaussian" else
                    pb.REGRESSION_KERNEL_BOXCAR),
            return_weights=True, output_encoding=out_enc)
        if bandwidth is not None:
            request.bandwidth = bandwidth
        response = self.call("NadarayaWatson", request)
        want_out, want_w = nadaraya_watson_ref(
            x_train, y_train, x_query, kernel,
            1.0 if bandwidth is None else float(np.float32(bandwidth)))
        got_out = from_tensor(response.output, out_enc)
        got_w = from_tensor(response.weights, out_enc)
        self.assertClose(got_out, want_out, what=f"{kernel} output")
        self.assertClose(got_w, want_w, atol=weight_atol, rtol=0.0,
                         what=f"{kernel} weights")
        return got_out, got_w

    def textbook_data(self, n=50):
        x = np.sort(self.rng.random(n) * 5).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8 + self.rng.normal(0, 0.5, n)).astype(
            np.float32)
        return x, y

    def test_gaussian_textbook(self):
        x, y = self.textbook_data()
        x_query = np.arange(0, 5, 0.1, dtype=np.float32)
        out, w = self.run_case(x, y, x_query, "gaussian")
        self.assertEqual(out.shape, (50,))
        self.assertEqual(w.shape, (50, 50))

    def test_gaussian_bandwidth_raw(self):
        x, y = self.textbook_data()
        x_query = np.arange(0, 5, 0.37, dtype=np.float32)
        self.run_case(x, y, x_query, "gaussian", bandwidth=3.7,
                      in_enc="raw", out_enc=RAW)

    def test_gaussian_far_query_still_has_weights(self):
        x, y = self.textbook_data(10)
        x_query = np.array([40.0], np.float32)
        # Logits near -800 carry float32 rounding of ~|logit| * 2^-24 each,
        # which the softmax turns into relative weight errors of that size:
        # the tolerance follows the logits, not the 1e-5 of ordinary rows.
        max_logit = float(((x_query[0] - x) ** 2).max()) / 2
        _, w = self.run_case(x, y, x_query, "gaussian",
                             weight_atol=8 * max_logit * 2.0 ** -24)
        self.assertTrue(np.all(np.isfinite(w)))
        self.assertAlmostEqual(w.sum(), 1.0, places=5)

    def test_boxcar_with_empty_neighbourhood(self):
        x, y = self.textbook_data(20)
        # 100 is out of every training point's reach: zero weights, zero output.
        x_query = np.array([0.5, 2.5, 4.0, 100.0], np.float32)
        out, w = self.run_case(x, y, x_query, "boxcar", bandwidth=2.0)
        self.assertEqual(out[-1], 0.0)
        self.assertTrue(np.all(w[-1] == 0.0))

    def test_multivariate(self):
        x_train, y_train = self.randn(30, 3), self.randn(30, 2)
        out, w = self.run_case(x_train, y_train, self.randn(7, 3), "gaussian",
                               bandwidth=0.8)
        self.assertEqual(out.shape, (7, 2))
        self.assertEqual(w.shape, (7, 30))


class FitBandwidthTest(ServerTestCase):

    def test_textbook_fit_decreases_loss(self):
        # d2l 11.2: 50 sorted x ~ U(0, 5), y = 2 sin x + x^0.8 + N(0, 0.5^2),
        # lr 0.5, 5 epochs, starting from w = 1.
        n = 50
        x = np.sort(self.rng.random(n) * 5).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8 + self.rng.normal(0, 0.5, n)).astype(
            np.float32)
        request = pb.FitBandwidthRequest(
            x_train=to_tensor(x), y_train=to_tensor(y, "raw"),
            initial_bandwidth=1.0, learning_rate=0.5, epochs=5)
        response = self.call("FitBandwidth", request)
        losses = list(response.loss_per_epoch)
        self.assertEqual(len(losses), 5)
        self.assertLess(response.final_loss, losses[0],
                        f"the fit did not decrease the loss: {losses} -> "
                        f"{response.final_loss}")
        self.assertTrue(math.isfinite(response.bandwidth))

        want_w, want_losses, want_final = fit_ref(x, y, 1.0, 0.5, 5)
        # The reference's gradient, checked against a central difference.
        loss_hi = loo_loss_and_grad(x, y, 1.0 + 1e-6)[0]
        loss_lo = loo_loss_and_grad(x, y, 1.0 - 1e-6)[0]
        self.assertAlmostEqual(loo_loss_and_grad(x, y, 1.0)[1],
                               (loss_hi - loss_lo) / 2e-6, delta=1e-4)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-3)
        self.assertAlmostEqual(abs(response.bandwidth), abs(want_w),
                               delta=1e-3 * abs(want_w))
        self.assertAlmostEqual(response.final_loss, want_final,
                               delta=1e-3 * want_final)

    def test_defaults_and_2d_shapes(self):
        x = np.sort(self.rng.random(20) * 5).astype(np.float32)
        y = (2 * np.sin(x)).astype(np.float32)
        request = pb.FitBandwidthRequest(x_train=to_tensor(x[:, None]),
                                         y_train=to_tensor(y[:, None]))
        response = self.call("FitBandwidth", request)
        # Defaults: w 1, learning rate 0.5, 5 epochs.
        self.assertEqual(len(response.loss_per_epoch), 5)
        self.assertAlmostEqual(response.loss_per_epoch[0],
                               loo_loss_and_grad(x, y, 1.0)[0],
                               delta=1e-4 * response.loss_per_epoch[0])


class ConcurrencyTest(ServerTestCase):

    def test_concurrent_calls_each_get_their_own_answer(self):
        # 48 calls in flight at once, of different shapes and lengths, half
        # of them raw: every response must match its own request.
        cases = []
        for i in range(48):
            B, Lq, Lk, d = 1 + i % 3, 1 + i % 7, 5 + i, 4 + 4 * (i % 4)
            q, k, v = self.randn(B, Lq, d), self.randn(B, Lk, d), self.randn(B, Lk, 3)
            lens = self.rng.integers(0, Lk + 1, size=B)
            enc = "raw" if i % 2 else "values"
            out_enc = RAW if i % 2 else VALUES
            request = pb.AttentionRequest(
                queries=to_tensor(q, enc), keys=to_tensor(k, enc),
                values=to_tensor(v, enc), valid_lens=to_lengths(lens),
                causal=bool(i % 5 == 0), return_weights=bool(i % 3 == 0),
                output_encoding=out_enc)
            future = self.stub.ScaledDotProductAttention.future(
                request, timeout=DEADLINE_S)
            cases.append((future, q, k, v, lens, i % 5 == 0, out_enc))
        for future, q, k, v, lens, causal, out_enc in cases:
            want, _ = attention_ref(q, k, v, lens, causal)
            got = from_tensor(future.result().output, out_enc)
            self.assertClose(got, want, what=f"concurrent call {q.shape}")


class BadInputTest(ServerTestCase):

    def assertInvalid(self, method, request, field):
        with self.assertRaises(grpc.RpcError) as caught:
            getattr(self.stub, method)(request, timeout=DEADLINE_S)
        error = caught.exception
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         f"{method}: {error.code()}: {error.details()}")
        self.assertIn(field, error.details(),
                      f"{method}: details do not name {field!r}")
        return error.details()

    def toy(self):
        return self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)

    def test_float16_out_of_range(self):
        q, k, v = self.toy()
        k[1, 3, 0] = 1e5
        request = pb.AttentionRequest(queries=to_tensor(q), keys=to_tensor(k),
                                      values=to_tensor(v),
                                      precision=pb.PRECISION_FLOAT16)
        details = self.assertInvalid("ScaledDotProductAttention", request, "keys")
        self.assertIn("65504", details)

    def test_values_shape_mismatch(self):
        q, k, v = self.toy()
        request = pb.AttentionRequest(queries=to_tensor(q), keys=to_tensor(k),
                                      values=to_tensor(v))
        del request.keys.values[-1]
        self.assertInvalid("ScaledDotProductAttention", request, "keys")

    def test_raw_shape_mismatch(self):
        a = to_tensor(self.randn(2, 3, 4), "raw")
        a.raw = a.raw[:-4]
        request = pb.BatchMatmulRequest(a=a, b=to_tensor(self.randn(2, 4, 5)))
        self.assertInvalid("BatchMatmul", request, "a")

    def test_depth_mismatch(self):
        q, _, v = self.toy()
        request = pb.AttentionRequest(queries=to_tensor(q),
                                      keys=to_tensor(self.randn(2, 10, 3)),
                                      values=to_tensor(v))
        self.assertInvalid("ScaledDotProductAttention", request, "keys")

    def test_nan_values(self):
        x = self.randn(2, 2, 4)
        x[1, 0, 2] = np.nan
        request = pb.MaskedSoftmaxRequest(x=to_tensor(x))
        self.assertInvalid("MaskedSoftmax", request, "x")

    def test_nan_raw(self):
        q, k, v = self.toy()
        v[0, 3, 1] = np.nan
        request = pb.AttentionRequest(queries=to_tensor(q), keys=to_tensor(k),
                                      values=to_tensor(v, "raw"))
        self.assertInvalid("ScaledDotProductAttention", request, "values")

    def test_inf_in_nadaraya_watson(self):
        request = pb.NadarayaWatsonRequest(
            x_train=to_tensor(np.array([0.0, 1.0, np.inf], np.float32)),
            y_train=to_tensor(np.array([0.0, 1.0, 2.0], np.float32)),
            x_query=to_tensor(np.array([0.5], np.float32)))
        self.assertInvalid("NadarayaWatson", request, "x_train")

    def test_length_above_keys(self):
        q, k, v = self.toy()
        request = pb.AttentionRequest(queries=to_tensor(q), keys=to_tensor(k),
                                      values=to_tensor(v),
                                      valid_lens=to_lengths([2, 11]))
        self.assertInvalid("ScaledDotProductAttention", request, "valid_lens")

    def test_both_values_and_raw(self):
        x = to_tensor(self.randn(1, 1, 2))
        x.raw = np.zeros(2, "<f4").tobytes()
        self.assertInvalid("MaskedSoftmax", pb.MaskedSoftmaxRequest(x=x), "x")

    def test_fit_with_one_point(self):
        request = pb.FitBandwidthRequest(
            x_train=to_tensor(np.array([1.0], np.float32)),
            y_train=to_tensor(np.array([2.0], np.float32)))
        self.assertInvalid("FitBandwidth", request, "x_train")


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(
        sys.modules[__name__])
    print(f"client_test.py: target {TARGET}, seed {SEED} (ATTNSERVE_TEST_SEED)")
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
