"""The pip-installed attnserve package against a real attnserve.

Run by run_test.sh, in the clean venv it just built and installed the package
into (never the source tree: the working directory is a temporary folder).
Checks:
- the install: the package and its generated stubs came from the build, the
  declared dependencies follow the stub generator, `import attnserve` stays
  light, the health/KServe messages stay out of protobuf's default pool;
- every Client method against a float64 numpy reference written here from
  docs/api.md's "Semantics" section, within error bounds derived from float32
  arithmetic (below), and masked weights exactly 0;
- the error mapping, one case per status class the client meets;
- attnserve.aio.Client: the same calls, errors, cancellation, concurrency;
- the plots for real: PNG pixel sizes, masked cells exactly the colormap's
  color for 0, each row's most intense cell where its largest weight is;
- attnserve-plot (the console script and in-process) and the chapter's
  example scripts, and the README's three-line example.

Environment (set by run_test.sh): ATTNSERVE_TARGET host:port;
ATTNSERVE_MODEL_REPOSITORY the server's repository (a copy of deploy/models);
ATTNSERVE_EXAMPLES client/python/examples; ATTNSERVE_SOURCE_COPY the copied
client/python that was built. Plain unittest; the last line printed is
"N passed, M failed".
"""

import asyncio
import contextlib
import io
import json
import math
import os
import runpy
import shutil
import struct
import subprocess
import sys
import time
import unittest
from importlib import metadata
from pathlib import Path

import grpc
import numpy as np

import attnserve
import attnserve.aio
from attnserve import plot, textbook

TARGET = os.environ.get("ATTNSERVE_TARGET", "127.0.0.1:8001")
MODELS = Path(os.environ.get("ATTNSERVE_MODEL_REPOSITORY", "deploy/models"))
EXAMPLES = Path(os.environ.get("ATTNSERVE_EXAMPLES", "client/python/examples"))
SOURCE_COPY = os.environ.get("ATTNSERVE_SOURCE_COPY")
SEED = int(os.environ.get("ATTNSERVE_TEST_SEED", "20240612"))
OUT = Path.cwd()
# Pinned by client/python/constraints.txt, which the test installs from.
PINNED_GRPC = "1.81.1"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def closed_port_target():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed once we return


# --------------------------------------------------------------------------
# The float64 reference (docs/api.md, "Semantics decided once"), on the inputs as
# the server sees them: rounded to float32.


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def row_mask(B, Q, K, valid_lens=None, causal=False):
    """(B, Q, K) True where key k takes part in row (b, q)."""
    mask = np.ones((B, Q, K), dtype=bool)
    if valid_lens is not None:
        lens = np.asarray(valid_lens)
        lens = np.repeat(lens[:, None], Q, axis=1) if lens.ndim == 1 else lens
        mask &= np.arange(K)[None, None, :] < lens[:, :, None]
    if causal:  # top-left aligned
        mask &= np.arange(K)[None, None, :] <= np.arange(Q)[None, :, None]
    return mask


def softmax(scores, mask):
    """Softmax over the True positions; masked exactly 0; empty rows 0."""
    s = np.where(mask, scores, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def bf16(a):
    """float32 rounded to bfloat16 (ties to even), as the server rounds."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


# --------------------------------------------------------------------------
# Error bounds from float32 arithmetic: the bounds of
# lib/attn/testing/error_bounds.h, in numpy. u = 2^-24 is float32's unit
# roundoff and gamma(n) = n u / (1 - n u) bounds n successive roundings
# (Higham 3.1), for any summation order, blocking or FMA use. A softmax row
# with L valid keys, exact scores s_j and score error at most E:
# - perturbing the scores moves each weight by a factor within exp(+-2E);
# - evaluating it adds gamma(L + 8 nb + 8) + u (|s_j - max| + range):
#   rounded exp arguments (u times their size), a polynomial exp good to 4u,
#   a sum of L terms, nb = ceil(L / 64) online-softmax rescales, one
#   reciprocal; flushing exp below e^-87 to 0 costs at most 2^-120;
# - weight bound p_j rho_j + 2^-120 (rho_j the product of those factors,
#   minus 1); output bound sum_j |v_j| (p_j (rho_j + gamma(L + 2)) + 2^-120).
# Score errors E: masked softmax 0 (the scores are the inputs); dot product
# gamma(d + 2) scale sum_c |q_c k_c| (Gaussian: plus sum_c k_c^2 / 2);
# additive: features carry gamma(dq) sum |W_q q| + gamma(dk) sum |W_k k| +
# u |f|, tanh adds 8u, the score sum gamma(h + 1) sum |w_v tanh f|;
# Nadaraya-Watson Gaussian gamma(dx + 6) |s_j|. Batch matmul: gamma(k + 1)
# sum_l |a_l b_l| + u |c|. The float64 reference's own error (~1e-16
# relative) is covered by a 1e-12 relative slack.

U = 2.0 ** -24
TINY = 2.0 ** -120


def gamma(n):
    n = np.asarray(n, dtype=np.float64)
    return n * U / (1 - n * U)


def softmax_bounds(scores, mask, score_error, values=None):
    """Bounds on the weights (like scores) and, given values (..., K, v), on
    the outputs (..., Q, v). score_error: per row, shape scores.shape[:-1]."""
    p = softmax(scores, mask)
    L = mask.sum(axis=-1)
    nb = np.ceil(L / 64.0)
    live = np.where(mask, scores, np.nan)
    with np.errstate(all="ignore"):
        top = np.nanmax(np.where(L[..., None] > 0, live, 0.0), axis=-1)
        bottom = np.nanmin(np.where(L[..., None] > 0, live, 0.0), axis=-1)
    spread = np.where(L > 0, top - bottom, 0.0)
    distance = np.where(mask, np.abs(scores - top[..., None]), 0.0)
    rho = (np.exp(2 * np.asarray(score_error))[..., None]
           * (1 + gamma(L + 8 * nb + 8))[..., None]
           * (1 + U * (distance + spread[..., None])) - 1)
    weight_bound = np.where(mask, p * rho + TINY, 0.0)
    if values is None:
        return weight_bound, None
    per_key = np.where(mask, p * (rho + gamma(L + 2)[..., None]) + TINY, 0.0)
    return weight_bound, per_key @ np.abs(values)


def attention_ref(q, k, v, valid_lens=None, causal=False, scale=None,
                  score="dot_product"):
    """(output, weights, output bound, weight bound); (B, [H,] L, d) inputs."""
    q, k, v = f32(q), f32(k), f32(v)
    d = q.shape[-1]
    if score == "dot_product":
        s = 1 / math.sqrt(d) if scale is None else float(np.float32(scale))
        scores = s * q @ np.swapaxes(k, -1, -2)
        size = s * np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    else:
        s = 1.0 if scale is None else float(np.float32(scale))
        diff = q[..., :, None, :] - k[..., None, :, :]
        scores = -s * (diff ** 2).sum(-1) / 2
        size = s * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2) +
                    (k ** 2).sum(-1)[..., None, :] / 2)
    B, Lq, Lk = q.shape[0], q.shape[-2], k.shape[-2]
    mask = row_mask(B, Lq, Lk, valid_lens, causal)
    if q.ndim == 4:
        mask = np.repeat(mask[:, None], q.shape[1], axis=1)
    error = gamma(d + 2) * size.max(axis=-1)
    w = softmax(scores, mask)
    wb, ob = softmax_bounds(scores, mask, error, v)
    return w @ v, w, ob, wb


def additive_ref(q, k, v, w_q, w_k, w_v, valid_lens=None):
    q, k, v, w_q, w_k, w_v = map(f32, (q, k, v, w_q, w_k, w_v))
    fq, fk = q @ w_q.T, k @ w_k.T  # (B, Lq, h), (B, Lk, h)
    f = fq[:, :, None, :] + fk[:, None, :, :]  # (B, Lq, Lk, h)
    t = np.tanh(f)
    scores = t @ w_v
    feature_error = (gamma(q.shape[-1]) * (np.abs(q) @ np.abs(w_q).T)[:, :, None, :]
                     + gamma(k.shape[-1]) * (np.abs(k) @ np.abs(w_k).T)[:, None, :, :]
                     + U * np.abs(f))
    h = w_v.shape[0]
    error = ((feature_error + 8 * U) @ np.abs(w_v)
             + gamma(h + 1) * (np.abs(t) @ np.abs(w_v))).max(axis=-1)
    B, Lq, Lk = scores.shape
    mask = row_mask(B, Lq, Lk, valid_lens)
    w = softmax(scores, mask)
    wb, ob = softmax_bounds(scores, mask, error, v)
    return w @ v, w, ob, wb


def nadaraya_watson_ref(x_train, y_train, x_query, kernel="gaussian", bandwidth=None):
    xt, yt, xq = f32(x_train), f32(y_train), f32(x_query)
    w = 1.0 if bandwidth is None else float(np.float32(bandwidth))
    xt2, xq2 = (xt[:, None], xq[:, None]) if xt.ndim == 1 else (xt, xq)
    y2 = yt[:, None] if yt.ndim == 1 else yt
    dist = np.sqrt(((xq2[:, None, :] - xt2[None, :, :]) ** 2).sum(-1))  # (m, n)
    u = w * dist
    if kernel == "gaussian":
        scores = -u ** 2 / 2
        mask = np.ones(scores.shape, dtype=bool)
        weights = softmax(scores, mask)
        wb, ob = softmax_bounds(scores, mask,
                                gamma(xt2.shape[1] + 6) * np.abs(scores).max(-1), y2)
    elif kernel == "boxcar":
        # Kernel values are exactly 0 or 1 (the test keeps every u away from
        # the edge by more than gamma(dx + 4)); only the normalisation rounds.
        assert np.all(np.abs(u - 1) > 1e-4), "a point on the boxcar's edge"
        mass = (u < 1).astype(np.float64)
        total = mass.sum(-1, keepdims=True)
        weights = np.divide(mass, total, out=np.zeros_like(mass), where=total > 0)
        rho = gamma(xt2.shape[0] + 2)
        wb = weights * rho
        ob = (weights * 2 * rho) @ np.abs(y2)
    else:
        raise ValueError(kernel)
    out = weights @ y2
    if yt.ndim == 1:
        out, ob = out[:, 0], ob[:, 0]
    return out, weights, ob, wb


def loo_loss_and_grad(x, y, w):
    """L(w) = sum_i (yhat_i - y_i)^2, yhat_i attending over every j != i."""
    x, y = f32(x), f32(y)
    d2 = (x[:, None] - x[None, :]) ** 2
    logits = -(w ** 2) * d2 / 2
    np.fill_diagonal(logits, -np.inf)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    yhat = a @ y
    slope = -w * d2
    np.fill_diagonal(slope, 0.0)
    da = a * (slope - (a * slope).sum(axis=1, keepdims=True))
    return ((yhat - y) ** 2).sum(), (2 * (yhat - y) * (da @ y)).sum()


def fit_ref(x, y, w0=1.0, lr=0.5, epochs=5):
    w, losses = float(np.float32(w0)), []
    for _ in range(epochs):
        loss, grad = loo_loss_and_grad(x, y, w)
        losses.append(loss)
        w -= float(np.float32(lr)) * grad
    return w, np.array(losses), loo_loss_and_grad(x, y, w)[0]


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + start:8 + n + end], "<f4").reshape(
            entry["shape"])
    return out


# --------------------------------------------------------------------------


CLIENT = None


def setUpModule():
    global CLIENT
    CLIENT = attnserve.Client(TARGET, timeout=30)
    CLIENT.wait_until_serving(timeout=15)


def tearDownModule():
    CLIENT.close()


class Case(unittest.TestCase):

    def setUp(self):
        self.rng = np.random.default_rng(SEED)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def assertWithin(self, got, want, bound, what):
        self.assertIsInstance(got, np.ndarray, what)
        self.assertEqual(got.dtype, np.float32, what)
        self.assertEqual(got.shape, want.shape, f"{what}: shape")
        self.assertTrue(got.flags.writeable, f"{what}: read-only array")
        excess = np.abs(got - want) - (bound + 1e-12 * np.abs(want))
        worst = np.unravel_index(np.argmax(excess), excess.shape)
        self.assertTrue(np.all(excess <= 0),
                        f"{what}: |got - want| over its bound at {worst}: got "
                        f"{got[worst]!r}, want {want[worst]!r}, bound {bound[worst]:.3g}")

    def assertMaskedZero(self, weights, mask, what):
        self.assertTrue(np.all(weights[~mask] == 0.0),
                        f"{what}: masked positions are not exactly 0")
        empty = ~mask.any(-1)
        self.assertTrue(np.all(weights[empty] == 0.0), f"{what}: empty rows not zero")

    def assertPngSize(self, path, size_inches, dpi):
        self.assertTrue(path.is_file(), f"no {path}")
        pixels = read_png(path)
        want = tuple(int(round(s * dpi)) for s in size_inches)
        self.assertEqual((pixels.shape[1], pixels.shape[0]), want, f"{path} pixel size")
        return pixels

    def assertError(self, code, fragment, call, *args, **kwargs):
        with self.assertRaises(attnserve.Error) as caught:
            call(*args, **kwargs)
        error = caught.exception
        self.assertEqual(error.code, code, f"{error}")
        self.assertIn(fragment, error.message, f"{error}")
        self.assertTrue(str(error).startswith(code.name + ": "), str(error))
        return error


class InstallTest(Case):

    def test_package_is_the_built_one(self):
        package = Path(attnserve.__file__).resolve()
        self.assertTrue(str(package).startswith(str(Path(sys.prefix).resolve())),
                        f"attnserve imported from {package}, not the venv")
        from attnserve import _generated
        self.assertEqual(_generated.GRPC_GENERATED_VERSION, PINNED_GRPC)
        self.assertEqual(len(_generated.PROTO_SHA256), 64)
        requires = metadata.requires("attnserve")
        self.assertIn(f"grpcio<2,>={PINNED_GRPC}", requires)
        self.assertTrue(any(r.startswith("protobuf") and ">=" + _generated.PROTOBUF_GENCODE_VERSION in r
                            for r in requires), requires)
        script = Path(sys.prefix) / "bin" / "attnserve-plot"
        self.assertTrue(script.is_file(), "no attnserve-plot console script")
        if SOURCE_COPY:  # the stubs were generated into the build, not the source
            self.assertFalse((Path(SOURCE_COPY) / "src/attnserve/_generated").exists())

    def test_import_is_light_and_pools_are_private(self):
        code = ("import sys, attnserve; assert 'matplotlib' not in sys.modules; "
                "attnserve.Client('127.0.0.1:1').close(); "
                "from google.protobuf import descriptor_pool as p\n"
                "for name in ('grpc.health.v1.HealthCheckRequest', "
                "'inference.RepositoryIndexRequest'):\n"
                "    try: p.Default().FindMessageTypeByName(name)\n"
                "    except KeyError: pass\n"
                "    else: raise SystemExit(name + ' is in the default pool')\n")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


class MaskedSoftmaxTest(Case):

    def check(self, x, lens):
        got = CLIENT.masked_softmax(x, valid_lens=lens)
        self.assertIsInstance(got, attnserve.Result)
        self.assertTrue(got.info.implementation)
        xs = f32(x)
        mask = row_mask(*xs.shape, None if lens is None else np.asarray(lens))
        want = softmax(xs, mask)
        wb, _ = softmax_bounds(xs, mask, np.zeros(xs.shape[:-1]))
        self.assertWithin(got.output, want, wb, "masked softmax")
        self.assertMaskedZero(got.output, mask, "masked softmax")
        return got.output

    def test_batch_lengths_with_zero_float64_fortran(self):
        x = np.asfortranarray(self.rng.standard_normal((3, 4, 5)) * 3)  # float64, F order
        out = self.check(x, np.array([2, 0, 5], dtype=np.int64))
        self.assertTrue(np.all(out[1] == 0))

    def test_row_lengths_float16_list(self):
        x = self.randn(2, 3, 7).astype(np.float16)
        self.check(x, [[1, 0, 7], [3, 6, 0]])

    def test_no_lengths_nested_list(self):
        self.check(self.randn(2, 2, 4).tolist(), None)

    def test_messages_past_grpc_default_4mib(self):
        # 2^20 elements each way (4 MiB + framing): over gRPC's default 4 MiB
        # receive limit, within the client's 256 MiB default and exactly at
        # this server's --max_request_elements.
        x = self.randn(1, 1024, 1024)
        out = CLIENT.masked_softmax(x, valid_lens=[1000]).output
        self.assertEqual(out.shape, (1, 1024, 1024))
        self.assertTrue(np.all(out[..., 1000:] == 0))
        np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-5)


class BatchMatmulTest(Case):

    def check(self, a, b, precision="float32", rounding=f32):
        got = CLIENT.batch_matmul(a, b, precision=precision)
        ar, br = rounding(a), rounding(b)
        want = ar @ br
        bound = gamma(ar.shape[-1] + 1) * (np.abs(ar) @ np.abs(br)) + U * np.abs(want)
        self.assertWithin(got.output, want, bound, f"batch matmul {precision}")

    def test_float32_fortran(self):
        self.check(np.asfortranarray(self.randn(2, 7, 33)), self.randn(2, 33, 5))

    def test_bfloat16_operands(self):
        # Operands rounded to bfloat16 (ties to even), float32 accumulation:
        # products of two 8-bit significands are exact in float32, so the
        # float32 bound applies to the rounded operands.
        self.check(self.randn(3, 16, 64), self.randn(3, 64, 8), "bfloat16", bf16)

    def test_float16_operands(self):
        self.check(self.randn(2, 9, 40), self.randn(2, 40, 3), "float16",
                   lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float64))


class AttentionTest(Case):

    def check(self, q, k, v, lens=None, **options):
        got = CLIENT.scaled_dot_product_attention(q, k, v, valid_lens=lens,
                                                  return_weights=True, **options)
        self.assertIsInstance(got, attnserve.AttentionResult)
        out, w, ob, wb = attention_ref(q, k, v, lens, options.get("causal", False),
                                       options.get("scale"),
                                       options.get("score", "dot_product"))
        self.assertWithin(got.output, out, ob, "attention output")
        self.assertWithin(got.weights, w, wb, "attention weights")
        self.assertMaskedZero(got.weights, wb > 0, "attention weights")
        return got

    def test_textbook_toy_case(self):
        toy = textbook.toy_attention()
        got = self.check(toy["queries"], toy["keys"], toy["values"], [2, 6])
        self.assertEqual(got.output.shape, (2, 1, 4))
        self.assertTrue(np.all(got.weights[0, 0, 2:] == 0) and np.all(got.weights[1, 0, 6:] == 0))

    def test_multi_head_row_lengths_causal(self):
        self.check(self.randn(2, 3, 5, 8), self.randn(2, 3, 6, 8), self.randn(2, 3, 6, 4),
                   np.array([[1, 2, 0, 6, 6], [6, 4, 3, 2, 1]]), causal=True)

    def test_gaussian_score_with_scale(self):
        self.check(self.randn(2, 3, 4), self.randn(2, 5, 4), self.randn(2, 5, 2), [2, 5],
                   score="gaussian", scale=0.5)

    def test_explicit_scale_float64(self):
        self.check(self.rng.standard_normal((2, 4, 6)), self.rng.standard_normal((2, 7, 6)),
                   self.rng.standard_normal((2, 7, 3)), scale=0.3)

    def test_without_weights(self):
        got = CLIENT.scaled_dot_product_attention(self.randn(1, 2, 4), self.randn(1, 3, 4),
                                                  self.randn(1, 3, 2))
        self.assertIsNone(got.weights)
        self.assertEqual(got.output.shape, (1, 2, 2))


class StoredMemoryTest(Case):
    """Queries against a stored memory (memory_name): run_test.sh stores the
    textbook's toy memory as `toy_memory`."""

    KEYS = np.array([(i % 5) * 0.5 - 1.0 for i in range(20)], np.float32).reshape(10, 2)
    VALUES = np.array([0.25 * i for i in range(40)], np.float32).reshape(10, 4)

    def test_queries_alone(self):
        queries = self.randn(2, 3, 2)
        got = CLIENT.scaled_dot_product_attention(queries, memory_name="toy_memory",
                                                  return_weights=True)
        keys = np.broadcast_to(self.KEYS, (2, 10, 2))
        values = np.broadcast_to(self.VALUES, (2, 10, 4))
        out, w, ob, wb = attention_ref(queries, keys, values)
        self.assertWithin(got.output, out, ob, "memory output")
        self.assertWithin(got.weights, w, wb, "memory weights")

    def test_stored_then_queried(self):
        # store_memory uploads it (RepositoryModelLoad); queries name it.
        keys, values = self.randn(40, 3), self.randn(40, 2)
        CLIENT.store_memory("py_memory", keys, values, scale=0.7)
        queries = self.randn(2, 5, 3)
        got = CLIENT.scaled_dot_product_attention(queries, memory_name="py_memory",
                                                  return_weights=True)
        out, w, ob, wb = attention_ref(queries, np.broadcast_to(keys, (2, 40, 3)),
                                       np.broadcast_to(values, (2, 40, 2)), scale=0.7)
        self.assertWithin(got.output, out, ob, "stored memory output")
        self.assertWithin(got.weights, w, wb, "stored memory weights")
        self.assertIn("py_memory", [m.name for m in CLIENT.models(ready_only=True)])
        # Replaced whole by the next upload, as BF16 (the bits the server
        # rounds to): the keys now differ, the answer with them.
        CLIENT.store_memory("py_memory", keys + 1.0, values, scale=0.7, bfloat16=True)
        again = CLIENT.scaled_dot_product_attention(queries, memory_name="py_memory")
        self.assertFalse(np.allclose(again.output, got.output, atol=1e-3))

    def test_stored_over_asyncio(self):
        keys, values = self.randn(12, 2), self.randn(12, 3)
        queries = self.randn(1, 4, 2)

        async def store_and_query():
            async with attnserve.aio.Client(TARGET, timeout=30) as client:
                await client.store_memory("aio_memory", keys, values)
                return await client.scaled_dot_product_attention(
                    queries, memory_name="aio_memory")
        got = asyncio.run(store_and_query())
        out, _, ob, _ = attention_ref(queries, keys[None], values[None])
        self.assertWithin(got.output, out, ob, "aio stored memory output")

    def test_appended_rows_are_served_at_once(self):
        # The first append makes the memory; each later one grows it, and
        # the next query attends over every row, weights included.
        keys, values = self.randn(7, 3), self.randn(7, 2)
        queries = self.randn(2, 4, 3)
        made = CLIENT.append_memory("py_grown", keys[:3], values[:3], create=True,
                                    scale=0.6)
        self.assertEqual(made, attnserve.Appended(first_row=0, rows=3, files=1))
        added = CLIENT.append_memory("py_grown", keys[3:], values[3:])
        self.assertEqual(added, attnserve.Appended(first_row=3, rows=7, files=2))
        got = CLIENT.scaled_dot_product_attention(queries, memory_name="py_grown",
                                                  return_weights=True)
        self.assertEqual(got.weights.shape, (2, 4, 7))
        out, w, ob, wb = attention_ref(queries, np.broadcast_to(keys, (2, 7, 3)),
                                       np.broadcast_to(values, (2, 7, 2)), scale=0.6)
        self.assertWithin(got.output, out, ob, "grown memory output")
        self.assertWithin(got.weights, w, wb, "grown memory weights")
        # Refused, naming the field; the memory keeps its rows.
        bad = values[:2].copy()
        bad[1, 0] = np.inf
        for call, code, words in (
                (lambda: CLIENT.append_memory("py_grown", keys[:2], bad),
                 grpc.StatusCode.INVALID_ARGUMENT, "values"),
                (lambda: CLIENT.append_memory("py_grown", keys[:2, :2], values[:2]),
                 grpc.StatusCode.INVALID_ARGUMENT, "keys: shape (2, 2) must be (n, 3)"),
                (lambda: CLIENT.append_memory("py_nobody", keys, values),
                 grpc.StatusCode.NOT_FOUND, "no model 'py_nobody'"),
                (lambda: CLIENT.append_memory("py_grown", keys, values, scale=2.0),
                 grpc.StatusCode.INVALID_ARGUMENT, "create=True")):
            with self.assertRaises(attnserve.Error) as caught:
                call()
            self.assertEqual(caught.exception.code, code)
            self.assertIn(words, caught.exception.message)
        again = CLIENT.scaled_dot_product_attention(queries, memory_name="py_grown")
        self.assertEqual(again.output.shape, (2, 4, 2))
        self.assertWithin(again.output, out, ob, "memory after refusals")
        # The oldest rows go: the memory is keys[2:] from the next call on.
        self.assertEqual(CLIENT.evict_memory("py_grown", oldest=2),
                         attnserve.Evicted(evicted=2, rows=5))
        got = CLIENT.scaled_dot_product_attention(queries, memory_name="py_grown",
                                                  return_weights=True)
        self.assertEqual(got.weights.shape, (2, 4, 5))
        out, w, ob, wb = attention_ref(queries, np.broadcast_to(keys[2:], (2, 5, 3)),
                                       np.broadcast_to(values[2:], (2, 5, 2)), scale=0.6)
        self.assertWithin(got.output, out, ob, "evicted memory output")
        self.assertWithin(got.weights, w, wb, "evicted memory weights")
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.evict_memory("py_grown", oldest=5)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("oldest: 5 must be in [1, 4]", caught.exception.message)

    def test_a_max_rows_window_keeps_the_newest_rows(self):
        keys, values = self.randn(9, 2), self.randn(9, 2)
        made = CLIENT.append_memory("py_window", keys[:6], values[:6], create=True,
                                    max_rows=4)
        self.assertEqual((made.rows, made.evicted), (4, 2))
        added = CLIENT.append_memory("py_window", keys[6:], values[6:])
        self.assertEqual(added, attnserve.Appended(first_row=1, rows=4, files=2,
                                                   evicted=3))
        queries = self.randn(1, 3, 2)
        got = CLIENT.scaled_dot_product_attention(queries, memory_name="py_window")
        out, _, ob, _ = attention_ref(queries, keys[None, 5:], values[None, 5:])
        self.assertWithin(got.output, out, ob, "windowed memory output")
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.append_memory("py_window", keys, values, max_rows=3)
        self.assertIn("create=True", caught.exception.message)

    def test_a_training_set_grows_over_asyncio(self):
        d = textbook.regression_data()
        half = len(d.x_train) // 2

        async def fit_append_query():
            async with attnserve.aio.Client(TARGET, timeout=30) as client:
                fit = await client.fit_bandwidth(d.x_train[:half], d.y_train[:half],
                                                 save_as="py_grown_fit")
                added = await client.append_memory("py_grown_fit", d.x_train[half:],
                                                   d.y_train[half:])
                evicted = await client.evict_memory("py_grown_fit", oldest=1)
                self.assertEqual(evicted.rows, len(d.x_train) - 1)
                fit = await client.fit_bandwidth(model_name="py_grown_fit")
                net = await client.nadaraya_watson(x_query=d.x_query,
                                                   model_name="py_grown_fit")
                return fit, added, net
        fit, added, net = asyncio.run(fit_append_query())
        self.assertEqual((added.first_row, added.rows), (half, len(d.x_train)))
        # The refit ran on the stored set as it grew: the reference's fit.
        want_w, _, _ = fit_ref(d.x_train[1:], d.y_train[1:])
        self.assertLessEqual(abs(abs(fit.bandwidth) - abs(want_w)),
                             (U + 1e-9) * abs(want_w))
        out, _, ob, _ = nadaraya_watson_ref(d.x_train[1:], d.y_train[1:], d.x_query,
                                            bandwidth=fit.bandwidth)
        self.assertWithin(net.output, out, ob, "grown training set output")

    def test_a_bad_memory_is_refused_and_the_stored_one_kept(self):
        keys, values = self.randn(8, 2), self.randn(8, 4)
        CLIENT.store_memory("kept_memory", keys, values)
        before = CLIENT.scaled_dot_product_attention(self.randn(1, 1, 2) * 0 + 0.5,
                                                     memory_name="kept_memory")
        bad = values.copy()
        bad[3, 1] = np.nan
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.store_memory("kept_memory", keys, bad)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("tensor 'values' element 13 is nan", caught.exception.message)
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.store_memory("kept_memory", keys, values[:5])
        self.assertIn("(8, 2) and values (5, 4)", caught.exception.message)
        after = CLIENT.scaled_dot_product_attention(self.randn(1, 1, 2) * 0 + 0.5,
                                                    memory_name="kept_memory")
        np.testing.assert_array_equal(after.output, before.output)

    def test_keys_beside_a_memory_are_refused(self):
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.scaled_dot_product_attention(self.randn(1, 1, 2), self.randn(1, 10, 2),
                                                self.randn(1, 10, 4),
                                                memory_name="toy_memory")
        self.assertIn("holds the keys and values", caught.exception.message)
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.scaled_dot_product_attention(self.randn(1, 1, 2))
        self.assertIn("or `memory_name`", caught.exception.message)


class AdditiveAttentionTest(Case):

    def check(self, q, k, v, lens, w_q, w_k, w_v, **call):
        got = CLIENT.additive_attention(q, k, v, valid_lens=lens, return_weights=True, **call)
        out, w, ob, wb = additive_ref(q, k, v, w_q, w_k, w_v, lens)
        self.assertWithin(got.output, out, ob, "additive output")
        self.assertWithin(got.weights, w, wb, "additive weights")
        self.assertMaskedZero(got.weights, wb > 0, "additive weights")

    def test_textbook_toy_case_tuple_weights(self):
        toy = textbook.toy_attention(query_dim=20)
        weights = textbook.additive_weights()
        self.check(toy["queries"], toy["keys"], toy["values"], [2, 6], weights.w_q,
                   weights.w_k, weights.w_v,
                   weights=(weights.w_q, weights.w_k, weights.w_v))

    def test_row_lengths_mapping_and_dataclass(self):
        q, k, v = self.randn(2, 3, 5), self.randn(2, 6, 4), self.randn(2, 6, 3)
        w_q, w_k, w_v = self.randn(7, 5), self.randn(7, 4), self.randn(7)
        lens = [[0, 6, 2], [1, 0, 3]]
        self.check(q, k, v, lens, w_q, w_k, w_v, weights={"w_q": w_q, "w_k": w_k, "w_v": w_v})
        self.check(q, k, v, lens, w_q, w_k, w_v,
                   weights=attnserve.AdditiveWeights(w_q=w_q, w_k=w_k, w_v=w_v))

    def test_repository_weights_by_name(self):
        stored = read_safetensors(MODELS / "additive_attention" / "weights.safetensors")
        toy = textbook.toy_attention(query_dim=stored["W_q"].shape[1])
        self.check(toy["queries"], toy["keys"], toy["values"], [2, 6], stored["W_q"],
                   stored["W_k"], stored["w_v"], weights_name="additive_attention")


class NadarayaWatsonTest(Case):

    def check(self, x_train, y_train, x_query, **options):
        got = CLIENT.nadaraya_watson(x_train, y_train, x_query, return_weights=True, **options)
        out, w, ob, wb = nadaraya_watson_ref(x_train, y_train, x_query,
                                             options.get("kernel", "gaussian"),
                                             options.get("bandwidth"))
        self.assertWithin(got.output, out, ob, "regression output")
        self.assertWithin(got.weights, w, wb, "regression weights")
        return got

    def test_textbook_nonparametric_and_bandwidth(self):
        d = textbook.regression_data()
        got = self.check(d.x_train, d.y_train, d.x_query)
        self.assertEqual(got.weights.shape, (50, 50))
        self.check(d.x_train, d.y_train, d.x_query, bandwidth=3.7)

    def test_boxcar_empty_neighbourhood(self):
        x = np.linspace(0.05, 4.95, 20, dtype=np.float32)
        y = np.sin(x).astype(np.float32)
        got = self.check(x, y, np.array([0.5, 2.5, 100.0], np.float32), kernel="boxcar",
                         bandwidth=2.0)
        self.assertEqual(got.output[-1], 0.0)
        self.assertTrue(np.all(got.weights[-1] == 0.0))

    def test_multivariate(self):
        got = self.check(self.randn(30, 3), self.randn(30, 2), self.randn(7, 3),
                         bandwidth=0.8)
        self.assertEqual(got.output.shape, (7, 2))


class FitBandwidthTest(Case):

    def test_textbook_fit_and_save(self):
        d = textbook.regression_data()
        got = CLIENT.fit_bandwidth(d.x_train, d.y_train, initial_bandwidth=1.0,
                                   learning_rate=0.5, epochs=5, save_as="pyclient_fit")
        self.assertIsInstance(got, attnserve.FitResult)
        want_w, want_losses, want_final = fit_ref(d.x_train, d.y_train)
        # The fit runs in double on the server (lib/attn/fit.h), as the
        # reference does; only the returned w is rounded to float32 (u).
        # 1e-9 covers the different summation orders through five steps.
        self.assertEqual(got.loss_per_epoch.dtype, np.float64)
        np.testing.assert_allclose(got.loss_per_epoch, want_losses, rtol=1e-9)
        self.assertLessEqual(abs(abs(got.bandwidth) - abs(want_w)),
                             (U + 1e-9) * abs(want_w))
        self.assertAlmostEqual(got.final_loss, want_final, delta=1e-9 * want_final)
        self.assertLess(got.final_loss, got.loss_per_epoch[0])
        names = {m.name: m for m in CLIENT.models()}
        self.assertIn("pyclient_fit", names, "save_as did not reach the repository")
        self.assertEqual(names["pyclient_fit"].state, "READY")
        # The saved model holds its training set: the textbook's
        # net(x_test, keys, values) is a call with the queries alone.
        net = CLIENT.nadaraya_watson(x_query=d.x_query, model_name="pyclient_fit",
                                     return_weights=True)
        out, w, ob, wb = nadaraya_watson_ref(d.x_train, d.y_train, d.x_query,
                                             bandwidth=got.bandwidth)
        self.assertWithin(net.output, out, ob, "fitted model output")
        self.assertWithin(net.weights, w, wb, "fitted model weights")
        with self.assertRaises(attnserve.Error) as caught:
            CLIENT.nadaraya_watson(x_query=d.x_query)
        self.assertIn("or `model_name`", caught.exception.message)

    def test_defaults(self):
        d = textbook.regression_data(n_train=20, seed=3)
        got = CLIENT.fit_bandwidth(d.x_train[:, None], d.y_train[:, None])
        self.assertEqual(len(got.loss_per_epoch), 5)
        np.testing.assert_allclose(got.loss_per_epoch, fit_ref(d.x_train, d.y_train)[1],
                                   rtol=1e-9)


class HealthAndModelsTest(Case):

    def test_health(self):
        self.assertEqual(CLIENT.health(), "SERVING")
        self.assertEqual(CLIENT.health("attention.v1.AttentionService"), "SERVING")

    def test_models(self):
        models = CLIENT.models(ready_only=True)
        self.assertTrue(all(isinstance(m, attnserve.ModelInfo) for m in models))
        names = {m.name for m in models}
        self.assertLessEqual({"masked_softmax", "batch_matmul", "dot_product_attention",
                              "nadaraya_watson", "additive_attention",
                              "nadaraya_watson_fitted"}, names)

    def test_default_timeout_per_call_override_and_metadata(self):
        x = np.sort(self.rng.random(300) * 5).astype(np.float32)
        with attnserve.Client(TARGET, timeout=0.2, metadata=[("x-client", "test")]) as c:
            self.assertError(grpc.StatusCode.DEADLINE_EXCEEDED, "", c.fit_bandwidth,
                             x, np.sin(x), epochs=100000)
            self.assertEqual(c.health(timeout=10, metadata=[("x-call", "1")]), "SERVING")
            self.assertEqual(len(c.fit_bandwidth(x, np.sin(x), epochs=2, timeout=None)
                                 .loss_per_epoch), 2)


class ErrorTest(Case):

    def toy(self):
        return self.randn(2, 1, 2), self.randn(2, 10, 2), self.randn(2, 10, 4)

    def test_invalid_argument_from_server_names_the_field(self):
        q, _, v = self.toy()
        error = self.assertError(INVALID, "keys: expected shape (2, Lk, 2), got (3, 10, 2)",
                                 CLIENT.scaled_dot_product_attention, q,
                                 self.randn(3, 10, 2), v)
        self.assertEqual(error.rpc, "ScaledDotProductAttention")
        self.assertIsInstance(error.__cause__, grpc.RpcError)
        x = self.randn(2, 2, 4)
        x[1, 0, 2] = np.nan
        self.assertError(INVALID, "x:", CLIENT.masked_softmax, x)
        q, k, v = self.toy()
        self.assertError(INVALID, "valid_lens", CLIENT.scaled_dot_product_attention,
                         q, k, v, valid_lens=[2, 11])
        self.assertError(INVALID, "x_train", CLIENT.fit_bandwidth, [1.0], [2.0])

    def test_invalid_argument_from_the_client(self):
        q, k, v = self.toy()
        self.assertError(INVALID, "queries", CLIENT.scaled_dot_product_attention,
                         q.astype(np.complex64), k, v)
        x = np.zeros((1, 1, 4))
        x[0, 0, 3] = 1e39  # finite in float64, infinite in float32
        error = self.assertError(INVALID, "x: element 3", CLIENT.masked_softmax, x)
        self.assertEqual(error.rpc, "")
        self.assertError(INVALID, "valid_lens", CLIENT.masked_softmax, np.zeros((1, 1, 4)),
                         valid_lens=[1.5])
        self.assertError(INVALID, "score", CLIENT.scaled_dot_product_attention, q, k, v,
                         score="cosine")
        self.assertError(INVALID, "kernel", CLIENT.nadaraya_watson, [0.0, 1.0], [0.0, 1.0],
                         [0.5], kernel="tricube")
        self.assertError(INVALID, "exactly one", CLIENT.additive_attention, q, k, v)
        self.assertError(INVALID, "exactly one", CLIENT.additive_attention, q, k, v,
                         weights=(q, k, v), weights_name="additive_attention")
        self.assertError(INVALID, "epochs", CLIENT.fit_bandwidth, [0.0, 1.0], [0.0, 1.0],
                         epochs=1.5)

    def test_not_found(self):
        q, k, v = self.toy()
        self.assertError(grpc.StatusCode.NOT_FOUND, "weights_name",
                         CLIENT.additive_attention, q, k, v, weights_name="no-such-model")
        self.assertError(grpc.StatusCode.NOT_FOUND, "", CLIENT.health, "no.such.Service")

    def test_resource_exhausted(self):
        # Over this server's --max_request_elements (2^20) ...
        self.assertError(grpc.StatusCode.RESOURCE_EXHAUSTED, "", CLIENT.masked_softmax,
                         np.zeros((1, 1024, 1025), np.float32))
        # ... and over the client's own message limit (checked before sending).
        with attnserve.Client(TARGET, timeout=10, max_message_bytes=4096) as small:
            self.assertError(grpc.StatusCode.RESOURCE_EXHAUSTED, "",
                             small.masked_softmax, np.zeros((1, 2, 1024), np.float32))

    def test_deadline_exceeded(self):
        # A fit of 10^5 epochs outlives a 0.2 s deadline; the server stops it
        # at its next epoch, and answers the next call at once.
        x = np.sort(self.rng.random(300) * 5).astype(np.float32)
        started = time.monotonic()
        self.assertError(grpc.StatusCode.DEADLINE_EXCEEDED, "", CLIENT.fit_bandwidth,
                         x, np.sin(x), epochs=100000, timeout=0.2)
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(CLIENT.health(), "SERVING")

    def test_unavailable(self):
        with attnserve.Client(closed_port_target(), timeout=10) as nobody:
            error = self.assertError(grpc.StatusCode.UNAVAILABLE, "", nobody.masked_softmax,
                                     np.zeros((1, 1, 2)))
            self.assertEqual(error.rpc, "MaskedSoftmax")

    def test_malformed_response_is_internal(self):
        from attnserve import _wire
        bad = _wire.pb.Tensor(shape=[2, 2], raw=b"\0" * 12)
        with self.assertRaises(attnserve.Error) as caught:
            _wire.from_tensor(bad, "output")
        self.assertEqual(caught.exception.code, grpc.StatusCode.INTERNAL)


class AsyncClientTest(Case):

    def test_same_surface(self):
        sync_methods = {n for n in dir(attnserve.Client) if not n.startswith("_")}
        async_methods = {n for n in dir(attnserve.aio.Client) if not n.startswith("_")}
        self.assertEqual(sync_methods, async_methods)

    def test_every_method_errors_cancellation_concurrency(self):
        asyncio.run(self.scenario())

    async def scenario(self):
        toy = textbook.toy_attention()
        add = textbook.toy_attention(query_dim=20)
        w = textbook.additive_weights()
        d = textbook.regression_data()
        x = self.randn(2, 3, 5)
        a, b = self.randn(2, 3, 4), self.randn(2, 4, 5)
        async with attnserve.aio.Client(TARGET, timeout=30) as client:
            await client.wait_until_serving(10)
            (soft, mm, att, additive, nw, fit, health, models) = await asyncio.gather(
                client.masked_softmax(x, [1, 5]), client.batch_matmul(a, b),
                client.scaled_dot_product_attention(**toy, return_weights=True),
                client.additive_attention(**add, weights=w, return_weights=True),
                client.nadaraya_watson(d.x_train, d.y_train, d.x_query, return_weights=True),
                client.fit_bandwidth(d.x_train, d.y_train), client.health(),
                client.models())
            mask = row_mask(2, 3, 5, [1, 5])
            self.assertWithin(soft.output, softmax(f32(x), mask),
                              softmax_bounds(f32(x), mask, np.zeros((2, 3)))[0], "aio softmax")
            want = f32(a) @ f32(b)
            self.assertWithin(mm.output, want, gamma(5) * (np.abs(f32(a)) @ np.abs(f32(b)))
                              + U * np.abs(want), "aio matmul")
            out, wt, ob, wb = attention_ref(toy["queries"], toy["keys"], toy["values"], [2, 6])
            self.assertWithin(att.output, out, ob, "aio attention")
            self.assertWithin(att.weights, wt, wb, "aio attention weights")
            out, wt, ob, wb = additive_ref(add["queries"], add["keys"], add["values"],
                                           w.w_q, w.w_k, w.w_v, [2, 6])
            self.assertWithin(additive.output, out, ob, "aio additive")
            out, wt, ob, wb = nadaraya_watson_ref(d.x_train, d.y_train, d.x_query)
            self.assertWithin(nw.output, out, ob, "aio regression")
            np.testing.assert_allclose(fit.loss_per_epoch,
                                       fit_ref(d.x_train, d.y_train)[1], rtol=1e-9)
            self.assertEqual(health, "SERVING")
            self.assertIn("dot_product_attention", {m.name for m in models})

            # Stored models by name: the toy memory (run_test.sh) and a fit
            # saved with its training set.
            queries = self.randn(2, 3, 2)
            memory = await client.scaled_dot_product_attention(
                queries, memory_name="toy_memory")
            out = attention_ref(queries,
                                np.broadcast_to(StoredMemoryTest.KEYS, (2, 10, 2)),
                                np.broadcast_to(StoredMemoryTest.VALUES, (2, 10, 4)))
            self.assertWithin(memory.output, out[0], out[2], "aio stored memory")
            saved = await client.fit_bandwidth(d.x_train, d.y_train, save_as="aio_fit")
            net = await client.nadaraya_watson(x_query=d.x_query, model_name="aio_fit")
            out = nadaraya_watson_ref(d.x_train, d.y_train, d.x_query,
                                      bandwidth=saved.bandwidth)
            self.assertWithin(net.output, out[0], out[2], "aio fitted model")

            # Errors map as in the blocking client.
            with self.assertRaises(attnserve.Error) as caught:
                await client.scaled_dot_product_attention(toy["queries"], self.randn(3, 10, 2),
                                                          toy["values"])
            self.assertEqual(caught.exception.code, INVALID)
            self.assertIn("keys", caught.exception.message)
            with self.assertRaises(attnserve.Error) as caught:
                await client.additive_attention(**add, weights_name="no-such-model")
            self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

            # Cancelling the task cancels the call: CancelledError, as asyncio wants.
            xs = np.sort(self.rng.random(300) * 5).astype(np.float32)
            task = asyncio.ensure_future(client.fit_bandwidth(xs, np.sin(xs), epochs=100000))
            await asyncio.sleep(0.2)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task

            # 24 calls in flight, each answered with its own result.
            cases = [(self.randn(1 + i % 3, 1 + i % 4, 8), self.randn(1 + i % 3, 5 + i, 8),
                      self.randn(1 + i % 3, 5 + i, 3)) for i in range(24)]
            results = await asyncio.gather(*(client.scaled_dot_product_attention(q, k, v)
                                             for q, k, v in cases))
            for (q, k, v), got in zip(cases, results):
                out, _, ob, _ = attention_ref(q, k, v)
                self.assertWithin(got.output, out, ob, f"aio concurrent {q.shape}")

        async with attnserve.aio.Client(closed_port_target(), timeout=10) as nobody:
            with self.assertRaises(attnserve.Error) as caught:
                await nobody.health()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)


# --------------------------------------------------------------------------
# Plots, checked in the PNG's pixels.


def read_png(path):
    from matplotlib import image
    return np.round(image.imread(path) * 255).astype(np.int64)  # (H, W, 4) RGBA


class PlotTest(Case):

    def assertHeatmapPixels(self, fig, ax, matrix, pixels, cmap_name, vmin, vmax, what):
        """Every cell's center pixel: exactly the colormap's color for 0 where
        the weight is 0, and each row's most intense cell (the nearest
        colormap entry, inverted) where its largest weight is."""
        import matplotlib
        cmap = matplotlib.colormaps[cmap_name]
        lut = cmap(np.linspace(0, 1, cmap.N), bytes=True)[:, :3].astype(np.int64)
        zero = np.asarray(cmap(0.0, bytes=True))
        height = pixels.shape[0]
        Q, K = matrix.shape
        level = np.zeros((Q, K))
        for q in range(Q):
            for k in range(K):
                x, y = ax.transData.transform((k, q))  # imshow: cell centers at (k, q)
                rgba = pixels[int(height - y), int(x)]
                if matrix[q, k] == 0.0:
                    self.assertTrue(np.array_equal(rgba, zero),
                                    f"{what}: cell ({q}, {k}) of weight 0 is {rgba}, "
                                    f"not the colormap's 0 color {zero}")
                level[q, k] = np.argmin(((lut - rgba[:3]) ** 2).sum(-1))
        for q in range(Q):
            row = matrix[q]
            if row.max() == 0.0:
                continue
            top2 = np.sort(row)[-2:] if K > 1 else np.array([0.0, row.max()])
            if (top2[1] - top2[0]) / (vmax - vmin) * cmap.N < 2:
                continue  # too close to tell apart in 256 colors
            self.assertEqual(int(np.argmax(level[q])), int(np.argmax(row)),
                             f"{what}: row {q}: most intense cell is not the largest weight")
        return level

    def test_heatmaps_of_server_weights(self):
        x = self.randn(3, 4, 6) * 2
        lens = np.array([[6, 3, 0, 1], [2, 6, 5, 4], [0, 0, 3, 6]])
        weights = CLIENT.masked_softmax(x, valid_lens=lens).output  # (3, 4, 6)
        path = OUT / "masked_heatmaps.png"
        fig = plot.show_heatmaps(weights[None], titles=["b0", "b1", "b2"], save=path, dpi=100)
        pixels = self.assertPngSize(path, fig.get_size_inches(), 100)
        self.assertEqual(len(fig.axes), 3 + 1, "three panels and one shared colorbar")
        vmax = float(weights.max())
        for b in range(3):
            self.assertHeatmapPixels(fig, fig.axes[b], weights[b], pixels, "Reds", 0.0, vmax,
                                     f"panel {b}")
        # The shared scale: the largest weight of all panels is the colormap's top.
        import matplotlib
        b, q, k = np.unravel_index(np.argmax(weights), weights.shape)
        x_px, y_px = fig.axes[b].transData.transform((k, q))
        self.assertTrue(np.array_equal(pixels[int(pixels.shape[0] - y_px), int(x_px)],
                                       matplotlib.colormaps["Reds"](1.0, bytes=True)))

    def test_toy_case_heatmap_explicit_size(self):
        toy = textbook.toy_attention()
        weights = CLIENT.scaled_dot_product_attention(**toy, return_weights=True).weights
        grid = weights.reshape(1, 1, 2, 10)
        path = OUT / "toy.png"
        fig = plot.show_heatmaps(grid, figsize=(5, 2), cmap="viridis", save=path, dpi=80)
        pixels = self.assertPngSize(path, (5, 2), 80)
        self.assertHeatmapPixels(fig, fig.axes[0], grid[0, 0], pixels, "viridis", 0.0,
                                 float(grid.max()), "toy")

    def test_kernel_regression_plot(self):
        d = textbook.regression_data()
        result = CLIENT.nadaraya_watson(d.x_train, d.y_train, d.x_query)
        path = OUT / "regression.png"
        fig = plot.plot_kernel_regression(d.x_train, d.y_train, d.x_query, result.output,
                                          d.y_truth, save=path)
        self.assertPngSize(path, (3.5, 2.5), 100)
        lines = {line.get_label(): line for line in fig.axes[0].lines}
        np.testing.assert_array_equal(lines["Pred"].get_ydata(), result.output.astype(float))
        np.testing.assert_array_equal(lines["Truth"].get_ydata(), d.y_truth.astype(float))
        np.testing.assert_array_equal(lines["Training"].get_xdata(), d.x_train.astype(float))

    def test_regression_comparison_heatmaps(self):
        d = textbook.regression_data()
        before = CLIENT.nadaraya_watson(d.x_train, d.y_train, d.x_query, return_weights=True)
        after = CLIENT.nadaraya_watson(d.x_train, d.y_train, d.x_query, bandwidth=20.0,
                                       return_weights=True)
        path = OUT / "comparison.png"
        fig = plot.plot_regression_comparison(d.x_train, d.y_train, d.x_query, before=before,
                                              after=after, y_truth=d.y_truth, save=path)
        pixels = self.assertPngSize(path, (8, 7), 100)
        self.assertEqual(len(fig.axes), 4 + 2, "four panels and two colorbars")
        for ax, result in ((fig.axes[2], before), (fig.axes[3], after)):
            self.assertHeatmapPixels(fig, ax, result.weights, pixels, "Reds", 0.0,
                                     float(result.weights.max()), ax.get_xlabel())


class CommandTest(Case):

    def run_cli(self, *argv):
        from attnserve import cli
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(list(argv))
        return status, out.getvalue(), err.getvalue()

    def test_console_script_heatmap(self):
        path = OUT / "cli_toy.png"
        script = shutil.which("attnserve-plot", path=str(Path(sys.prefix) / "bin"))
        done = subprocess.run([script, "heatmap", "--target", TARGET, "-o", str(path)],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("scaled_dot_product_attention weights (2, 1, 10)", done.stdout)
        pixels = read_png(path)
        self.assertIn(f"{pixels.shape[1]}x{pixels.shape[0]} px", done.stdout)

    def test_heatmap_inputs_json_and_npz(self):
        request = {"x": self.randn(2, 3, 4).tolist(), "valid_lens": [[1, 0, 4], [2, 3, 4]]}
        (OUT / "softmax.json").write_text(json.dumps(request))
        status, out, err = self.run_cli("heatmap", "--target", TARGET, "--rpc", "masked_softmax",
                                        "--input", str(OUT / "softmax.json"),
                                        "-o", str(OUT / "cli_softmax.png"))
        self.assertEqual(status, 0, err)
        self.assertIn("(2, 3, 4)", out)
        toy = textbook.toy_attention(query_dim=20)
        np.savez(OUT / "additive.npz", weights_name=np.array("additive_attention"), **toy)
        status, out, err = self.run_cli("heatmap", "--target", TARGET, "--rpc", "additive",
                                        "--input", str(OUT / "additive.npz"), "--dpi", "50",
                                        "-o", str(OUT / "cli_additive.png"))
        self.assertEqual(status, 0, err)
        self.assertTrue((OUT / "cli_additive.png").is_file())

    def test_regression(self):
        path = OUT / "cli_regression.png"
        status, out, err = self.run_cli("regression", "--target", TARGET, "--epochs", "3",
                                        "--dpi", "50", "-o", str(path))
        self.assertEqual(status, 0, err)
        self.assertIn("in 3 epochs", out)
        self.assertPngSize(path, (8, 7), 50)

    def test_exit_statuses(self):
        status, _, err = self.run_cli("heatmap", "--target", closed_port_target(),
                                      "--timeout", "10", "-o", str(OUT / "never.png"))
        self.assertEqual(status, 1)
        self.assertIn("UNAVAILABLE", err)
        (OUT / "bad.json").write_text(json.dumps({"queries": [1.0], "nonsense": 1}))
        status, _, err = self.run_cli("heatmap", "--target", TARGET, "--input",
                                      str(OUT / "bad.json"))
        self.assertEqual(status, 2)
        self.assertIn("nonsense", err)
        q = textbook.toy_attention()
        (OUT / "bad_shape.json").write_text(json.dumps(
            {"queries": q["queries"].tolist(), "keys": np.ones((3, 10, 2)).tolist(),
             "values": q["values"].tolist()}))
        status, _, err = self.run_cli("heatmap", "--target", TARGET, "--input",
                                      str(OUT / "bad_shape.json"))
        self.assertEqual(status, 1)
        self.assertIn("INVALID_ARGUMENT: keys", err)


class ExamplesTest(Case):
    """The chapter's figures, redrawn by the example scripts from this server
    (what client/python/examples/make_figures.sh runs for docs/images)."""

    def test_examples(self):
        figures = OUT / "figures"
        figures.mkdir(exist_ok=True)
        scripts = sorted(EXAMPLES.glob("*.py"))
        self.assertEqual({s.name for s in scripts},
                         {"attention_cues.py", "masked_softmax.py", "attention_scoring.py",
                          "nadaraya_watson.py", "attention_memory.py"})
        for script in scripts:
            argv = sys.argv
            sys.argv = [str(script), "--target", TARGET, "--out", str(figures)]
            if script.name == "nadaraya_watson.py":
                # The chapter's net(x_test, keys, values): the fit saved with
                # its training set and queried by name.
                sys.argv += ["--save_as", "chapter_example"]
            try:
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    runpy.run_path(str(script), run_name="__main__")
            finally:
                sys.argv = argv
            if script.name == "attention_cues.py":
                self.assertIn("weights equal the identity: True", out.getvalue())
            if script.name == "nadaraya_watson.py":
                self.assertIn("saved as chapter_example; queried by name",
                              out.getvalue())
            if script.name == "attention_memory.py":
                self.assertIn("the memory's answer is the Nadaraya-Watson "
                              "estimate: True", out.getvalue())
        made = {p.name for p in figures.glob("*.png")}
        self.assertEqual(made, {"chapter_identity.png", "chapter_masked_softmax.png",
                                "chapter_additive.png", "chapter_dot_product.png",
                                "chapter_nadaraya_watson.png", "chapter_memory.png"})

    def test_readme_three_lines(self):
        # The README's example, verbatim but for the target.
        code = ("import numpy as np, attnserve\n"
                "w = attnserve.Client(\"localhost:8001\").masked_softmax("
                "np.random.rand(2, 2, 4), valid_lens=[2, 3]).output\n"
                "attnserve.plot.show_heatmaps(w, save=\"weights.png\")\n"
                ).replace("localhost:8001", TARGET)
        subprocess.run([sys.executable, "-c", code], cwd=OUT, check=True, timeout=60)
        self.assertTrue((OUT / "weights.png").is_file())


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    print(f"client_test.py: attnserve {attnserve.__version__} from "
          f"{Path(attnserve.__file__).parent}, target {TARGET}, seed {SEED}")
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
