#!/usr/bin/env python3
"""Peer benchmark: PyTorch on the CPU, at the shapes attnserve's benchmarks use.

It times PyTorch's implementations of each operation:
  - "textbook": the code of the attention chapter of Dive into Deep Learning
    (bmm + masked softmax with the -1e6 fill + bmm; additive attention with tanh
    features; Nadaraya-Watson as softmax(-(x - x_i)^2 / 2) @ y);
  - "sdpa": torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0),
    which on the CPU runs PyTorch's fused flash-attention kernel, given the
    valid lengths as a boolean mask (it computes masked blocks all the same);
  - "sdpa-full", "sdpa-causal", "sdpa-bf16": the same kernel with no mask (full
    work), with is_causal=True, and with bfloat16 inputs (on CPUs with AMX,
    PyTorch runs its bf16 blocks on AMX through oneDNN);
  - "sdpa-bf16-masked": bfloat16 inputs with the valid lengths' mask.

(attnserve's copy of the team's shared peer script, with the bf16 masked case
added; bench/run_benchmarks.sh runs it.)

Install PyTorch from PyPI (`pip install torch numpy`) for the real peer; Debian's
python3-torch 1.13 has no fused kernel and a slow reference BLAS.

Usage: torch_attention_bench.py [--threads 2] [--repeats 15] [--json out.json]
                                [--only "CASE/IMPL" ...]
Prints one row per (case, implementation): median milliseconds, GFLOP/s, and
the peak extra memory of one call where it can be measured. --only times just
the named rows (e.g. "large B8 L512 d64/sdpa-bf16"; bench/paired_goals.py
alternates them with ours).
"""
import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def masked_softmax(X, valid_lens):
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1], dtype=torch.float32)[None, :] < valid_lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return F.softmax(X.reshape(shape), dim=-1)


def textbook_dot(q, k, v, valid_lens):
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
    return torch.bmm(masked_softmax(scores, valid_lens), v)


def sdpa(q, k, v, valid_lens, dtype=None):
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    mask = None
    if valid_lens is not None:
        mask = (torch.arange(k.shape[1])[None, None, :] < valid_lens[:, None, None])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sdpa_full(q, k, v, causal=False, dtype=None):
    """Full work, as attnserve's "no lengths" cases: no mask (optionally causal),
    optionally in another dtype (bf16: PyTorch's AMX path on CPUs that have it)."""
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None],
                                          is_causal=causal)


def textbook_additive(q, k, v, valid_lens, W_q, W_k, w_v):
    features = torch.tanh((q @ W_q.T).unsqueeze(2) + (k @ W_k.T).unsqueeze(1))
    scores = (features @ w_v).squeeze(-1)
    return torch.bmm(masked_softmax(scores, valid_lens), v)


def textbook_nw(x_query, x_train, y_train):
    weights = F.softmax(-((x_query[:, None] - x_train[None, :]) ** 2) / 2, dim=1)
    return weights @ y_train


def timed(fn, repeats):
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def rss_growth_mib(fn):
    """Peak RSS growth of one call (coarse: ru_maxrss only grows)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (after - before) / 1024.0


def cases():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    for name, B, L, d in [("medium B32 L64 d64", 32, 64, 64),
                          ("large B8 L512 d64", 8, 512, 64),
                          ("long B1 L4096 d64", 1, 4096, 64)]:
        q, k, v = r(B, L, d), r(B, L, d), r(B, L, d)
        lens = torch.randint(1, L + 1, (B,), generator=g)
        flops = 4.0 * B * L * L * d
        yield name, "textbook", flops, (lambda q=q, k=k, v=v, l=lens: textbook_dot(q, k, v, l))
        if hasattr(F, "scaled_dot_product_attention"):
            yield name, "sdpa", flops, (lambda q=q, k=k, v=v, l=lens: sdpa(q, k, v, l))
            # Full work: no mask. "sdpa-full" matches attnserve's lens:0 cases,
            # "sdpa-causal" its causal:1 cases, "sdpa-bf16" its bf16:1 cases.
            yield name, "sdpa-full", flops, (lambda q=q, k=k, v=v: sdpa_full(q, k, v))
            yield name, "sdpa-causal", flops, (
                lambda q=q, k=k, v=v: sdpa_full(q, k, v, causal=True))
            yield name, "sdpa-bf16", flops, (
                lambda q=q, k=k, v=v: sdpa_full(q, k, v, dtype=torch.bfloat16))
            yield name, "sdpa-bf16-masked", flops, (
                lambda q=q, k=k, v=v, l=lens: sdpa(q, k, v, l, dtype=torch.bfloat16))
    B, L, h = 32, 64, 64
    q, k, v = r(B, L, 64), r(B, L, 64), r(B, L, 64)
    W_q, W_k, w_v = r(h, 64), r(h, 64), r(h)
    lens = torch.randint(1, L + 1, (B,), generator=g)
    flops = 2.0 * B * L * 64 * h * 2 + 4.0 * B * L * L * h + 2.0 * B * L * L * 64
    yield "additive B32 L64 q=k=h=64", "textbook", flops, (
        lambda: textbook_additive(q, k, v, lens, W_q, W_k, w_v))
    n = 4096
    x_train, _ = torch.sort(r(n) * 2.5 + 2.5)
    y_train, x_query = r(n), r(n) * 2.5 + 2.5
    yield "nadaraya-watson 4096x4096", "textbook", 6.0 * n * n, (
        lambda: textbook_nw(x_query, x_train, y_train))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--only", action="append", default=[],
                    help='time only this "CASE/IMPL" row (repeatable)')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with torch.inference_mode():
        for name, impl, flops, fn in cases():
            if args.only and f"{name}/{impl}" not in args.only:
                continue
            ms = timed(fn, args.repeats)
            rows.append({"case": name, "impl": impl, "median_ms": ms,
                         "gflops": flops / ms / 1e6, "extra_mib": rss_growth_mib(fn)})
            print(f"{name:28s} {impl:16s} {ms:10.3f} ms {flops / ms / 1e6:9.2f} GFLOP/s")
    unknown = set(args.only) - {f"{row['case']}/{row['impl']}" for row in rows}
    if unknown:
        raise SystemExit(f"--only: no such case/impl: {sorted(unknown)}")
    meta = {"torch": torch.__version__, "threads": args.threads, "repeats": args.repeats}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
