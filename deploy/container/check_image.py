"""Checks of a running attnserve container from outside, for test_image.sh.

usage: check_image.py typed-api --target HOST:PORT --attnctl ATTNCTL
       check_image.py kserve    --target HOST:PORT
       check_image.py models    --target HOST:PORT --attnctl ATTNCTL --models DIR

  typed-api  attention.v1 ScaledDotProductAttention through the host's
             attnctl (--input JSON, valid lengths, weights returned), every
             number checked against a float64 numpy reference.
  kserve     inference.GRPCInferenceService ModelInfer of the built-in
             dot_product_attention model through tritonclient, against the
             same reference.
  models     the image's example model repository is served: RepositoryIndex
             lists additive_attention and nadaraya_watson_fitted as READY,
             nadaraya_watson_fitted (KServe) and additive_attention (typed
             API, weights_name) answer as their weights in DIR (the
             repository's deploy/models, which the image copies) say.

Each prints one line saying what it checked and exits 0, or prints why not
and exits 1. Runs in the venv of tests/kserve/requirements.txt (numpy,
tritonclient[grpc]). Inputs come from a fixed seed; the tolerances are the
KServe test's (tests/kserve/tritonclient_test.py) for float32 kernels
against float64.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

SEED = 20240611
DEADLINE_S = 20.0
ATOL = 1e-5   # weights and attention outputs against float64
OUT_ATOL = 1e-4  # outputs that sum many terms (additive, regression)


class CheckFailed(Exception):
    pass


def f64(array):
    return np.asarray(array, dtype=np.float32).astype(np.float64)


def masked_softmax(scores, lens):
    """Softmax over the first lens[b] keys of each row; the rest 0."""
    weights = np.zeros_like(scores)
    for b, n in enumerate(lens):
        s = scores[b, :, :n]
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        weights[b, :, :n] = e / e.sum(axis=-1, keepdims=True)
    return weights


def attention_ref(q, k, v, lens):
    q, k, v = f64(q), f64(k), f64(v)
    scores = np.einsum("bqd,bkd->bqk", q, k) / math.sqrt(q.shape[-1])
    weights = masked_softmax(scores, lens)
    return weights @ v, weights


def compare(name, got, want, atol):
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise CheckFailed(f"{name}: shape {got.shape}, expected {want.shape}")
    error = float(np.max(np.abs(got - want))) if want.size else 0.0
    if not error <= atol:
        raise CheckFailed(f"{name}: max |error| {error:.3g} > {atol:g}")
    return error


def tensor_json(array):
    return {"shape": list(array.shape),
            "values": [float(x) for x in array.ravel()]}


def from_json(tensor):
    shape = [int(d) for d in tensor["shape"]]
    return np.asarray(tensor.get("values", []), np.float64).reshape(shape)


def call_attnctl(attnctl, target, subcommand, request):
    """Runs `attnctl SUBCOMMAND --input request.json` and parses its JSON."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(request, f)
        f.flush()
        run = subprocess.run(
            [attnctl, subcommand, "--target", target, "--deadline", "20s",
             "--input", f.name], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise CheckFailed(f"attnctl {subcommand} exited {run.returncode}: "
                          f"{run.stderr.strip()}")
    return json.loads(run.stdout)


def infer(client, model, inputs, outputs):
    tensors = []
    for name, array in inputs:
        array = np.ascontiguousarray(array)
        tensor = grpcclient.InferInput(name, list(array.shape),
                                       np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors, outputs=[
        grpcclient.InferRequestedOutput(n) for n in outputs],
        client_timeout=DEADLINE_S)


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32 tensors only)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    return {name: np.frombuffer(
        data[8 + size + info["data_offsets"][0]:
             8 + size + info["data_offsets"][1]],
        np.float32).reshape(info["shape"])
        for name, info in header.items() if name != "__metadata__"}


def check_typed_api(args, rng):
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, 7, 5)).astype(np.float32)
    lens = [3, 7]
    response = call_attnctl(args.attnctl, args.target, "attention", {
        "queries": tensor_json(q), "keys": tensor_json(k),
        "values": tensor_json(v),
        "valid_lens": {"shape": [2], "values": lens},
        "return_weights": True})
    want_out, want_weights = attention_ref(q, k, v, lens)
    e1 = compare("output", from_json(response["output"]), want_out, ATOL)
    e2 = compare("weights", from_json(response["weights"]), want_weights, ATOL)
    return (f"ScaledDotProductAttention (2x3x8, 2x7x8, 2x7x5, valid_lens "
            f"3,7) on {response['info']['implementation']}: max |error| "
            f"{max(e1, e2):.2g} against float64")


def check_kserve(args, rng):
    q = rng.standard_normal((2, 4, 16)).astype(np.float32)
    k = rng.standard_normal((2, 9, 16)).astype(np.float32)
    v = rng.standard_normal((2, 9, 3)).astype(np.float32)
    lens = np.array([5, 9], np.int32)
    with grpcclient.InferenceServerClient(url=args.target) as client:
        if not client.is_server_ready(client_timeout=DEADLINE_S):
            raise CheckFailed("ServerReady says not ready")
        result = infer(client, "dot_product_attention",
                       [("queries", q), ("keys", k), ("values", v),
                        ("valid_lens", lens)],
                       ["output", "attention_weights"])
    want_out, want_weights = attention_ref(q, k, v, lens)
    e1 = compare("output", result.as_numpy("output"), want_out, ATOL)
    e2 = compare("attention_weights", result.as_numpy("attention_weights"),
                 want_weights, ATOL)
    return (f"ModelInfer dot_product_attention (2x4x16, 2x9x16, 2x9x3): max "
            f"|error| {max(e1, e2):.2g} against float64")


def check_models(args, rng):
    expected = ("additive_attention", "nadaraya_watson_fitted")
    with grpcclient.InferenceServerClient(url=args.target) as client:
        index = {m.name: m.state for m in
                 client.get_model_repository_index().models}
        for name in expected:
            if index.get(name) != "READY":
                raise CheckFailed(f"RepositoryIndex: {name} is "
                                  f"{index.get(name, 'missing')}: {index}")
        # Nadaraya-Watson with the repository's fitted bandwidth, textbook data.
        w = float(read_safetensors(os.path.join(
            args.models, "nadaraya_watson_fitted",
            "weights.safetensors"))["bandwidth"][0])
        x = np.sort(rng.uniform(0, 5, 50)).astype(np.float32)
        y = (2 * np.sin(x) + x ** 0.8 +
             rng.normal(0, 0.5, 50)).astype(np.float32)
        xq = np.linspace(0, 5, 20, dtype=np.float32)
        result = infer(client, "nadaraya_watson_fitted",
                       [("x_train", x), ("y_train", y), ("x_query", xq)],
                       ["y_pred"])
    d = (f64(xq)[:, None] - f64(x)[None, :]) * w
    s = -d * d / 2
    e = np.exp(s - s.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)) @ f64(y)
    e1 = compare("y_pred", result.as_numpy("y_pred"), want, OUT_ATOL)

    # Additive attention by weights_name, through the typed API.
    weights = read_safetensors(os.path.join(
        args.models, "additive_attention", "weights.safetensors"))
    w_q, w_k, w_v = (f64(weights[n]) for n in ("W_q", "W_k", "w_v"))
    q = rng.standard_normal((2, 3, w_q.shape[1])).astype(np.float32)
    k = rng.standard_normal((2, 5, w_k.shape[1])).astype(np.float32)
    v = rng.standard_normal((2, 5, 4)).astype(np.float32)
    lens = [2, 5]
    response = call_attnctl(args.attnctl, args.target, "additive-attention", {
        "queries": tensor_json(q), "keys": tensor_json(k),
        "values": tensor_json(v), "weights_name": "additive_attention",
        "valid_lens": {"shape": [2], "values": lens}})
    features = (f64(q) @ w_q.T)[:, :, None, :] + (f64(k) @ w_k.T)[:, None]
    attention = masked_softmax(np.tanh(features) @ w_v, lens)
    e2 = compare("additive output", from_json(response["output"]),
                 attention @ f64(v), OUT_ATOL)
    return (f"RepositoryIndex lists {', '.join(expected)} READY; "
            f"nadaraya_watson_fitted (bandwidth {w:.4g}, KServe) and "
            f"additive_attention (typed, weights_name) answer as their "
            f"weights say: max |error| {max(e1, e2):.2g}")


CHECKS = {"typed-api": check_typed_api, "kserve": check_kserve,
          "models": check_models}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--target", required=True)
    parser.add_argument("--attnctl")
    parser.add_argument("--models")
    args = parser.parse_args()
    try:
        print(CHECKS[args.check](args, np.random.default_rng(SEED)))
    except Exception as error:  # any failure is this check's failure
        print(f"{type(error).__name__}: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
