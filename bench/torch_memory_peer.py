#!/usr/bin/env python3
"""PyTorch's own gain from batching against a stored memory, for the table
in docs/batching.md: 64 single-query attention calls against one memory of
N key-value pairs (d = v = 64, float32 or bfloat16) one after another,
against the same 64 queries as one batch, on the CPU.

  python3 bench/torch_memory_peer.py [THREADS] [float32|bfloat16]
      (default 2 threads, float32; needs torch)

Prints one line per N: both times and their ratio. The kernel alone, no
server: it says how much batching can pay for any implementation that reads
the memory once per call.
"""
import sys
import time

import torch


def attend(queries, keys, values):
    scores = queries @ keys.T / keys.shape[1] ** 0.5
    return torch.softmax(scores, dim=-1) @ values


def best_of(runs, call):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
    generator = torch.Generator().manual_seed(0)
    for n in (4096, 65536, 262144, 1048576):
        keys = torch.randn(n, 64, generator=generator).to(dtype)
        values = torch.randn(n, 64, generator=generator).to(dtype)
        queries = torch.randn(64, 64, generator=generator).to(dtype)
        attend(queries, keys, values)  # warm
        alone = best_of(3, lambda: [attend(queries[i:i + 1], keys, values)
                                    for i in range(64)])
        batched = best_of(3, lambda: attend(queries, keys, values))
        print(f"N={n:>8}: 64 alone {alone * 1e3:8.1f} ms, one batch of 64 "
              f"{batched * 1e3:7.1f} ms, batching pays {alone / batched:4.1f}x",
              flush=True)


if __name__ == "__main__":
    main()
