#!/usr/bin/env python3
"""PyTorch's side of bench/cuda_memory_bench: attention over a memory that
stays on the GPU (keys and values [N, 64]), a call being Q query rows.

For N = 65,536, 262,144 and 1,048,576, float32 and bfloat16, Q = 1 and 64,
times with CUDA events (median of 7 rounds of 20 calls; 3 rounds of 2 for
a path slower than 5 ms a call):
  plain: softmax((q @ k^T) * d^-0.5) @ v, float32 products staying float32
         (TF32 off, PyTorch's default), and the same in bfloat16;
  sdpa:  F.scaled_dot_product_attention (PyTorch picks its kernel).
Also the device-to-device copy bandwidth (bytes read + written), the
ceiling a pass over the memory is measured against. Prints CSV rows.

Usage: python3 bench/torch_memory_gpu.py [N...]   (needs PyTorch and a GPU)
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def timed_us(f, reps=20, rounds=7):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    f()
    end.record()
    torch.cuda.synchronize()
    if start.elapsed_time(end) > 5:  # ms: a slow path (fp32 SDPA's math)
        reps, rounds = 2, 3
    times = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps():
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    us = timed_us(lambda: b.copy_(a), reps=10, rounds=5)
    return 2 * a.numel() * 4 / us / 1e3


def main():
    sizes = [int(n) for n in sys.argv[1:]] or [65536, 262144, 1048576]
    torch.backends.cuda.matmul.allow_tf32 = False
    d = 64
    print(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}")
    print(f"# device-to-device copy: {copy_bandwidth_gbps():.0f} GB/s")
    print("peer,N,dtype,Q,path,us,queries_per_s,GBps")
    for n in sizes:
        for dtype in (torch.float32, torch.bfloat16):
            k = torch.randn(1, 1, n, d, device="cuda", dtype=dtype)
            v = torch.randn(1, 1, n, d, device="cuda", dtype=dtype)
            memory_bytes = (k.numel() + v.numel()) * k.element_size()
            for q_rows in (1, 64):
                q = torch.randn(1, 1, q_rows, d, device="cuda", dtype=dtype)
                paths = {
                    "plain": lambda: torch.softmax(
                        (q @ k.transpose(-1, -2)) * d ** -0.5, -1) @ v,
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
                }
                with torch.inference_mode():
                    for path, f in paths.items():
                        us = timed_us(f)
                        name = str(dtype).split(".")[-1]
                        print(f"torch,{n},{name},{q_rows},{path},{us:.1f},"
                              f"{q_rows / us * 1e6:.0f},{memory_bytes / us / 1e3:.0f}",
                              flush=True)
            del k, v
            torch.cuda.empty_cache()


main()
