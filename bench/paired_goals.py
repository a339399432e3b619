#!/usr/bin/env python3
"""The CPU kernels' speed goals against PyTorch, measured in pairs.

bench/run_benchmarks.sh times every case of ours, then every case of the
peer, minutes apart. On a shared virtual machine the speed of the same binary
drifts by 20% within minutes, so a ratio of two such medians can move by as
much as the goal's margin. Here each round times one of our cases and the
peer's same case back to back, in fresh processes, alternating which goes
first, and the ratio is taken within the round; the table gives the median of
the rounds' ratios, with their range.

The cases are the full-work goals of docs/benchmarks.md: float32 medium,
large and long, and bfloat16 large and long, each against PyTorch's SDPA at
the same precision (bfloat16 given float32 operands, as our API is), and the
bfloat16 large case against the AMX ceiling (BM_AmxCeiling: oneDNN's bf16
matmuls of its two products alone) where the CPU has AMX.

usage: paired_goals.py [--rounds 5] [--threads 2]
                       [--binary build/bench/attention_benchmark]
Needs PyTorch 2.x from PyPI (pip install torch numpy).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from machine import cpu_line

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, our benchmark, the peer's "case/impl" or a benchmark of ours to be
# held against, the goal as a ratio, what the ratio is)
PAIRS = [
    ("medium B32 L64 d64, fp32",
     "BM_Attention/B:32/L:64/d:64/lens:0/weights:0/bf16:0/causal:0/real_time",
     "medium B32 L64 d64/sdpa-full", 1.2, "vs torch"),
    ("large B8 L512 d64, fp32",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:0/causal:0/real_time",
     "large B8 L512 d64/sdpa-full", 1.2, "vs torch"),
    ("long B1 L4096 d64, fp32",
     "BM_Attention/B:1/L:4096/d:64/lens:0/weights:0/bf16:0/causal:0/real_time",
     "long B1 L4096 d64/sdpa-full", 1.2, "vs torch"),
    ("large B8 L512 d64, bf16",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:1/causal:0/real_time",
     "large B8 L512 d64/sdpa-bf16", 1.3, "vs torch"),
    ("long B1 L4096 d64, bf16",
     "BM_Attention/B:1/L:4096/d:64/lens:0/weights:0/bf16:1/causal:0/real_time",
     "long B1 L4096 d64/sdpa-bf16", 1.3, "vs torch"),
    ("large B8 L512 d64, bf16",
     "BM_Attention/B:8/L:512/d:64/lens:0/weights:0/bf16:1/causal:0/real_time",
     "BM_AmxCeiling/B:8/L:512/d:64/real_time", 0.7, "of the AMX ceiling"),
]


def ours_ms(binary, name, threads):
    """The benchmark's own time for one case, in a fresh process."""
    result = subprocess.run(
        [binary, f"--benchmark_filter=^{name}$", "--benchmark_min_time=0.5",
         "--benchmark_min_warmup_time=0.2", "--benchmark_format=json"],
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        capture_output=True, text=True, check=True)
    runs = json.loads(result.stdout)["benchmarks"]
    if not runs or runs[0].get("error_occurred"):
        raise LookupError(runs[0].get("error_message") if runs else "no run")
    unit = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}[runs[0]["time_unit"]]
    return runs[0]["real_time"] * unit


def peer_ms(row, threads):
    """PyTorch's median time for one "case/impl" row, in a fresh process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, os.path.join(HERE, "torch_attention_bench.py"),
             "--threads", str(threads), "--repeats", "15", "--only", row,
             "--json", out.name],
            capture_output=True, text=True, check=True)
        with open(out.name) as written:
            return json.load(written)["rows"][0]["median_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary",
                    default=os.path.join(HERE, "..", "build", "bench",
                                         "attention_benchmark"))
    args = ap.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"{args.binary}: build first (make build)")
    times = {index: ([], [], []) for index in range(len(PAIRS))}
    skipped = {}
    for round_index in range(args.rounds):
        for index, (label, ours, other, _, kind) in enumerate(PAIRS):
            if index in skipped:
                continue
            measure_other = ((lambda: ours_ms(args.binary, other, args.threads))
                             if other.startswith("BM_")
                             else (lambda: peer_ms(other, args.threads)))
            try:
                if round_index % 2 == 0:
                    mine, theirs = ours_ms(args.binary, ours, args.threads), measure_other()
                else:
                    theirs = measure_other()
                    mine = ours_ms(args.binary, ours, args.threads)
            except LookupError as error:
                skipped[index] = str(error)
                continue
            ours_list, theirs_list, ratios = times[index]
            ours_list.append(mine)
            theirs_list.append(theirs)
            # Both ratios read "above 1: ours better": the peer's time over
            # ours, and for the ceiling our rate over its (the same work).
            ratios.append(theirs / mine)
            print(f"round {round_index + 1} {label} {kind}: ours {mine:.3f} ms, "
                  f"{other} {theirs:.3f} ms, {theirs / mine:.2f}", file=sys.stderr)
    print(cpu_line() + f"; {args.threads} threads; {args.rounds} rounds, "
          "each pair back to back")
    print()
    print("| case, full work | ours ms | theirs ms | ratio, median (range) | goal | met |")
    print("|---|---:|---:|---:|---:|---|")
    for index, (label, _, other, goal, kind) in enumerate(PAIRS):
        if index in skipped:
            print(f"| {label} {kind} | | | skipped: {skipped[index]} | {goal}x | |")
            continue
        ours_list, theirs_list, ratios = times[index]
        ratio = statistics.median(ratios)
        theirs = "AMX ceiling" if other.startswith("BM_") else "torch"
        shown = (f"{ratio:.0%} ({min(ratios):.0%}-{max(ratios):.0%})"
                 if kind != "vs torch" else
                 f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        wanted = f"{goal:.0%}" if kind != "vs torch" else f"{goal}x"
        print(f"| {label} {kind} | {statistics.median(ours_list):.3f} | "
              f"{statistics.median(theirs_list):.3f} ({theirs}) | {shown} | "
              f"{wanted} | {'yes' if ratio >= goal else '**no**'} |")


if __name__ == "__main__":
    main()
