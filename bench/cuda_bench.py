#!/usr/bin/env python3
"""The CUDA backend beside PyTorch's scaled_dot_product_attention, one run.

  python3 bench/cuda_bench.py [BENCH_BINARY] [--iterations N]

Runs BENCH_BINARY (default build/bench/cuda_attention_bench; our fused
kernel on device-resident inputs, plus a whole backend call and its device
pool's peak), then times PyTorch on the same GPU at the same shapes
(B=8, H=16, L=1024 and 4096, d=64 and 128): float32 through the
memory-efficient kernel (PyTorch's float32 fused path), bf16 through the
flash kernel. Prints a Markdown table and the issue's bars; exits 1 when a
bar is missed. Needs a GPU and PyTorch.
"""
import argparse
import json
import subprocess
import sys


def torch_ms(torch, fn, iterations):
    for _ in range(3):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iterations


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary", nargs="?", default="build/bench/cuda_attention_bench")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()

    run = subprocess.run([args.binary, f"--iterations={args.iterations}"],
                         capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        sys.exit(f"cuda_bench: {args.binary} exited {run.returncode}")
    ours = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}")
    rows, misses = [], []
    shapes = sorted({(r["d"], r["L"]) for r in ours})
    for d, length in shapes:
        def pick(kind, precision):
            return next(r for r in ours if r["kind"] == kind and r["d"] == d
                        and r["L"] == length and r["precision"] == precision)
        q, k, v = (torch.randn(8, 16, length, d, device="cuda") for _ in range(3))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            t32 = torch_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v),
                           args.iterations)
        qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t16 = torch_ms(torch, lambda: F.scaled_dot_product_attention(qb, kb, vb),
                           args.iterations)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            F.scaled_dot_product_attention(q, k, v)
        torch_extra = (torch.cuda.max_memory_allocated() - base) / 2**20
        del q, k, v, qb, kb, vb
        torch.cuda.empty_cache()
        flops = 4.0 * 8 * 16 * length * length * d
        o32, o16, ofp16, call = (pick("fused", "fp32"), pick("fused", "bf16"),
                                 pick("fused", "fp16"), pick("call", "fp32"))
        r32, r16 = t32 / o32["ms"], t16 / o16["ms"]
        rows.append((d, length, o32["ms"], flops / o32["ms"] * 1e-9, t32, r32,
                     o16["ms"], t16, r16, ofp16["ms"], call["ms"], call["peak_mib"],
                     torch_extra))
        if r32 < 0.8:
            misses.append(f"d={d} L={length}: fp32 at {r32:.2f}x PyTorch (bar 0.8x)")
        if r16 < 0.5:
            misses.append(f"d={d} L={length}: bf16 at {r16:.2f}x PyTorch flash (bar 0.5x)")

    print("\n| d | L | ours fp32 ms | TFLOP/s | PyTorch fp32 ms | speed ratio | "
          "ours bf16 ms | PyTorch flash bf16 ms | speed ratio | ours fp16 ms | "
          "whole call ms (host copies) | our call peak MiB | PyTorch extra MiB |")
    print("|" + "---|" * 13)
    for row in rows:
        print("| %d | %d | %.3f | %.1f | %.3f | %.2fx | %.3f | %.3f | %.2fx | %.3f | "
              "%.1f | %.1f | %.1f |" % row)
    by_d = {}
    for row in rows:
        by_d.setdefault(row[0], []).append((row[1], row[11]))
    for d, points in by_d.items():
        points.sort()
        (l0, m0), (l1, m1) = points[0], points[-1]
        growth = m1 / m0 if m0 else float("inf")
        print(f"\nd={d}: our peak grows {growth:.2f}x for {l1 / l0:.0f}x the length "
              f"(linear: {l1 / l0:.0f}x; quadratic would be {(l1 / l0) ** 2:.0f}x)")
        if growth > 1.25 * (l1 / l0):
            misses.append(f"d={d}: peak memory grows {growth:.2f}x, faster than linear")
    for miss in misses:
        print("MISSED:", miss)
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
