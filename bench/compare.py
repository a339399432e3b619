#!/usr/bin/env python3
"""Prints one markdown table from attention_benchmark's JSON and the PyTorch
peer's JSON (bench/torch_attention_bench.py --json). Medians only.

Each of our cases sits beside PyTorch doing the same work: its float32 and
bfloat16 SDPA with the same mask (or none, or causal). The ratio is PyTorch's
time over ours at the case's own precision (above 1: attnserve is faster).

usage: compare.py ours.json peer.json [threads]
"""
import json
import os
import sys

from machine import cpu_line

FP32, BF16 = "fp32", "bf16"

CASES = [
    # (label, our benchmark name prefix, our precision, peer case,
    #  peer fp32 impl, peer bf16 impl)
    ("medium B32 L64 d64, peer's lengths",
     "BM_Attention/B:32/L:64/d:64/lens:1/weights:0/bf16:0/causal:0", FP32,
     "medium B32 L64 d64", "sdpa", "sdpa-bf16-masked"),
    ("medium, no lengths (full work)",
     "BM_Attention/B:32/L:64/d:64/lens:0/weights:0/bf16:0/causal:0", FP32,
     "medium B32 L64 d64", "sdpa-full", "sdpa-bf16"),
    ("large B8 L512 d64, peer's lengths",
     "BM_Attention/B:8/L:512/d:64/lens:1/weights:0/bf16:0/causal:0", FP32,
     "large B8 L512 d64", "sdpa", "sdpa-bf16-masked"),
    ("large, peer's lengths, bf16",
     "BM_Attention/B:8/L:512/d:64/lens:1/weights:0/bf16:1/causal:0", BF16,
     "large B8 L512 d64", "sdpa", "sdpa-bf16-masked"),
    ("large, peer's lengths, weights returned",
     "BM_Attention/B:8/L:512/d:64/lens:1/weights:1/bf16:0/causal:0", FP32,
     "large B8 L512 d64", "textbook", None),
    ("large, no lengths (full work)",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:0/causal:0", FP32,
     "large B8 L512 d64", "sdpa-full", "sdpa-bf16"),
    ("large, no lengths, bf16",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:1/causal:0", BF16,
     "large B8 L512 d64", "sdpa-full", "sdpa-bf16"),
    ("large, no lengths, weights returned",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:1/bf16:0/causal:0", FP32,
     None, None, None),
    ("large, causal",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:0/causal:1", FP32,
     "large B8 L512 d64", "sdpa-causal", None),
    ("long B1 L4096 d64, peer's length (619)",
     "BM_Attention/B:1/L:4096/d:64/lens:1/weights:0/bf16:0/causal:0", FP32,
     "long B1 L4096 d64", "sdpa", "sdpa-bf16-masked"),
    ("long, peer's length, bf16",
     "BM_Attention/B:1/L:4096/d:64/lens:1/weights:0/bf16:1/causal:0", BF16,
     "long B1 L4096 d64", "sdpa", "sdpa-bf16-masked"),
    ("long, no lengths (full work)",
     "BM_Attention/B:1/L:4096/d:64/lens:0/weights:0/bf16:0/causal:0", FP32,
     "long B1 L4096 d64", "sdpa-full", "sdpa-bf16"),
    ("long, no lengths, bf16",
     "BM_Attention/B:1/L:4096/d:64/lens:0/weights:0/bf16:1/causal:0", BF16,
     "long B1 L4096 d64", "sdpa-full", "sdpa-bf16"),
    ("additive B32 L64 q=k=h=64", "BM_Additive", FP32,
     "additive B32 L64 q=k=h=64", "textbook", None),
    ("Nadaraya-Watson 4096 x 4096", "BM_NadarayaWatson", FP32,
     "nadaraya-watson 4096x4096", "textbook", None),
]


def milliseconds(benchmark):
    scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[benchmark["time_unit"]]
    return benchmark["real_time"] * scale


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    threads = sys.argv[3] if len(sys.argv) > 3 else peer["meta"]["threads"]
    medians = {}
    for b in ours["benchmarks"]:
        if b.get("aggregate_name", "median") == "median":
            name = b.get("run_name", b["name"])
            medians[name.removesuffix("/real_time")] = b
    peer_rows = {(r["case"], r["impl"]): r for r in peer["rows"]}
    # Instruction-set caps stand in for another CPU kind (e.g. AVX2 only).
    caps = [f"{name}={os.environ[name]}" for name in (
        "ATTN_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
        "ATEN_CPU_CAPABILITY") if os.environ.get(name)]
    capped = f"; capped: {' '.join(caps)}" if caps else ""
    print(f"{cpu_line()}; {threads} threads{capped}\n")
    print("| case | attnserve ms | GFLOP/s | extra MiB | torch fp32 ms | torch bf16 ms "
          "| vs torch, same precision |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    labels = set()
    for label, ours_name, precision, peer_case, fp32_impl, bf16_impl in CASES:
        b = medians.get(ours_name)
        if b is None:
            continue
        if b.get("label"):
            labels.add(b["label"])
        ms = milliseconds(b)
        fp32 = peer_rows.get((peer_case, fp32_impl))
        bf16 = peer_rows.get((peer_case, bf16_impl))
        same = bf16 if precision == BF16 else fp32
        fp32_name = f" ({fp32_impl})" if fp32 and fp32_impl != "sdpa-full" else ""
        cells = [label, f"{ms:.3f}", f"{b['GFLOPs']:.0f}", f"{b['extra_MiB']:.2f}",
                 f"{fp32['median_ms']:.3f}{fp32_name}" if fp32 else "",
                 f"{bf16['median_ms']:.3f}" if bf16 else "",
                 f"**{same['median_ms'] / ms:.2f}x**" if same else ""]
        print("| " + " | ".join(cells) + " |")
    # The bf16 cases against the AMX ceiling at their sizes (BM_AmxCeiling:
    # oneDNN's bf16 matmuls of the two products alone).
    for label, size, case in (("large", "B:8/L:512/d:64", "B:8/L:512/d:64"),
                              ("long", "B:1/L:4096/d:64", "B:1/L:4096/d:64")):
        ceiling = medians.get(f"BM_AmxCeiling/{size}")
        attention = medians.get(
            f"BM_Attention/{case}/lens:0/weights:0/bf16:1/causal:0")
        if ceiling is None or attention is None or ceiling.get("error_occurred"):
            continue
        print(f"\nAMX ceiling, {label} ({size}): oneDNN's bf16 matmuls of the two "
              f"products alone {ceiling['GFLOPs']:.0f} GFLOP/s; bf16 attention at "
              f"full work {attention['GFLOPs']:.0f} GFLOP/s = "
              f"**{attention['GFLOPs'] / ceiling['GFLOPs']:.0%}** of it")
    for b in ours["benchmarks"]:
        if b["name"].startswith("BM_Toy") and b.get("aggregate_name") == "median":
            print(f"\nToy call ({b['run_name'].removesuffix('/real_time')}): "
                  f"{b['real_time']:.2f} {b['time_unit']} median")
    print(f"\nattnserve's bf16 path here: {', '.join(sorted(labels)) or 'not run'}. "
          f"torch {peer['meta']['torch']}. Ratios are torch's time over ours "
          "(above 1: attnserve faster); GFLOP/s count the nominal work as the "
          "peer does (valid lengths skip real work). torch's masked SDPA computes "
          "the masked blocks; its fp32 column is sdpa with the mask unless named.")


if __name__ == "__main__":
    main()
