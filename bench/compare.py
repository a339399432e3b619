#!/usr/bin/env python3
"""Prints one markdown table from attention_benchmark's JSON and the PyTorch
peer's JSON (shared/bench/torch_attention_bench.py --json). Medians only."""
import json
import sys

from machine import cpu_line

CASES = [
    # (label, our benchmark name prefix, peer case name)
    ("medium B32 L64 d64, peer's lengths",
     "BM_Attention/B:32/L:64/d:64/lens:1/weights:0/bf16:0/causal:0", "medium B32 L64 d64"),
    ("medium, no lengths (full work)",
     "BM_Attention/B:32/L:64/d:64/lens:0/weights:0/bf16:0/causal:0", None),
    ("large B8 L512 d64, peer's lengths",
     "BM_Attention/B:8/L:512/d:64/lens:1/weights:0/bf16:0/causal:0", "large B8 L512 d64"),
    ("large, peer's lengths, weights returned",
     "BM_Attention/B:8/L:512/d:64/lens:1/weights:1/bf16:0/causal:0", None),
    ("large, no lengths (full work)",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:0/causal:0", None),
    ("large, no lengths, weights returned",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:1/bf16:0/causal:0", None),
    ("large, no lengths, bf16 (emulated)",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:1/causal:0", None),
    ("large, causal",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:0/causal:1", None),
    ("long B1 L4096 d64, peer's length (619)",
     "BM_Attention/B:1/L:4096/d:64/lens:1/weights:0/bf16:0/causal:0", "long B1 L4096 d64"),
    ("long, no lengths (full work)",
     "BM_Attention/B:1/L:4096/d:64/lens:0/weights:0/bf16:0/causal:0", None),
    ("additive B32 L64 q=k=h=64", "BM_Additive", "additive B32 L64 q=k=h=64"),
    ("Nadaraya-Watson 4096 x 4096", "BM_NadarayaWatson", "nadaraya-watson 4096x4096"),
]


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    medians = {}
    for b in ours["benchmarks"]:
        if b.get("aggregate_name", "median") == "median":
            name = b.get("run_name", b["name"])
            medians[name.removesuffix("/real_time")] = b
    peer_rows = {(r["case"], r["impl"]): r for r in peer["rows"]}
    print(cpu_line() + "\n")
    print("| case | attnserve ms | GFLOP/s | extra MiB | torch textbook ms | torch sdpa ms "
          "| vs sdpa | vs textbook |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, ours_name, peer_case in CASES:
        b = medians.get(ours_name)
        if b is None:
            continue
        ms = b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e3
        text = peer_rows.get((peer_case, "textbook")) if peer_case else None
        sdpa = peer_rows.get((peer_case, "sdpa")) if peer_case else None
        cells = [label, f"{ms:.3f}", f"{b['GFLOPs']:.0f}",
                 f"{b['extra_MiB']:.2f}",
                 f"{text['median_ms']:.3f}" if text else "",
                 f"{sdpa['median_ms']:.3f}" if sdpa else "",
                 f"{sdpa['median_ms'] / ms:.2f}x" if sdpa else "",
                 f"{text['median_ms'] / ms:.2f}x" if text else ""]
        print("| " + " | ".join(cells) + " |")
    for b in ours["benchmarks"]:
        if b["name"].startswith("BM_Toy") and b.get("aggregate_name") == "median":
            print(f"\nToy call ({b['run_name'].removesuffix('/real_time')}): "
                  f"{b['real_time']:.2f} {b['time_unit']} median")
    print(f"\ntorch {peer['meta']['torch']}, {peer['meta']['threads']} threads; "
          f"GFLOP/s count the nominal work as the peer does (valid lengths skip real work).")


if __name__ == "__main__":
    main()
