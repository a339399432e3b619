#!/usr/bin/env python3
"""Prints bench/batching_bench.sh's table from the load reports (JSON) and
the metrics scraped before and after each row."""
import json
import os
import sys

from machine import cpu_line


def metrics(path):
    values = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    return values


def delta(out, row, name):
    before = metrics(os.path.join(out, row + ".before.prom"))
    after = metrics(os.path.join(out, row + ".after.prom"))
    return after.get(name, 0.0) - before.get(name, 0.0)


def delta_all(out, row, family, label):
    """The change of every series of `family` carrying `label`, summed (the
    kernel histogram has one series per backend)."""
    after = metrics(os.path.join(out, row + ".after.prom"))
    return sum(delta(out, row, name) for name in after
               if name.startswith(family + "{") and label in name)


def main():
    out, max_delay_us = sys.argv[1], float(sys.argv[2])
    report = {}
    for name in os.listdir(out):
        if name.endswith(".json"):
            report[name[:-5]] = json.load(open(os.path.join(out, name)))
    rpc = 'rpc="ScaledDotProductAttention"'

    def rpc_of(row):
        return 'rpc="MaskedSoftmax"' if row.startswith("trivial") else rpc

    def kernel_ms(row):
        total = delta_all(out, row, "attnserve_kernel_duration_seconds_sum", rpc)
        count = delta_all(out, row, "attnserve_kernel_duration_seconds_count", rpc)
        return 1e3 * total / count if count else float("nan")

    def batch_mean(row):
        total = delta(out, row, "attnserve_batch_size_sum{%s}" % rpc_of(row))
        count = delta(out, row, "attnserve_batch_size_count{%s}" % rpc_of(row))
        return total / count if count else float("nan")

    def waste(row):
        computed = delta(out, row, "attnserve_batch_computed_elements_total{%s}" % rpc_of(row))
        padding = delta(out, row, "attnserve_batch_padding_elements_total{%s}" % rpc_of(row))
        return padding / computed if computed else float("nan")

    print(cpu_line())
    gpu = os.environ.get("ATTN_GPU_NAME")
    print(f"GPU: {gpu}\n" if gpu else "")

    def gpu_share(row):
        """The share of the row's kernel calls that ran on the GPU (the rest
        stayed on the CPU: below --cuda_min_flops, or no GPU)."""
        if row.startswith("health"):
            return ""
        cuda = delta(out, row, "attnserve_kernel_duration_seconds_count{backend=\"cuda\",%s}" % rpc_of(row))
        total = delta_all(out, row, "attnserve_kernel_duration_seconds_count", rpc_of(row))
        return f"{100 * cuda / total:.0f}%" if total else ""

    def cpu_us_per_call(row):
        """The server's CPU time (user + system) per call over the row's
        warm-up and measured window, at the measured rate."""
        r = report[row]
        calls = r["throughput_rps"] * (r["warmup_s"] + r["duration_s"])
        cpu = delta(out, row, "process_cpu_seconds_total")
        return 1e6 * cpu / calls if calls else float("nan")

    print("| case (64 in flight) | batching | req/s | p50 ms | p99 ms | server CPU µs / call | mean batch | padding waste | on the GPU | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in ["health", "trivial", "toy", "medium", "ragged"]:
        for mode in ["off", "on"]:
            r = report.get(f"{case}_{mode}")
            if r is None:
                continue
            lat = r["latency_ms"]
            errors = sum(r.get("errors", {}).values())
            batch = f"{batch_mean(f'{case}_{mode}'):.1f}" if mode == "on" and case != "health" else ""
            pad = f"{100 * waste(f'{case}_{mode}'):.1f}%" if mode == "on" and case != "health" else ""
            cpu = cpu_us_per_call(f"{case}_{mode}")
            print(f"| {case} | {mode} | {r['throughput_rps']:.0f} | {lat['p50']:.2f} | "
                  f"{lat['p99']:.2f} | {cpu:.0f} | {batch} | {pad} | "
                  f"{gpu_share(f'{case}_{mode}')} | {errors} |")

    def rps(row):
        return report[row]["throughput_rps"]

    print()
    checks = [
        ("toy: batching on / off >= 2", rps("toy_on") / rps("toy_off"), 2.0),
        ("medium: batching on / off >= 1.5 (>= 2 on a GPU)", rps("medium_on") / rps("medium_off"),
         2.0 if gpu else 1.5),
        ("ragged: batching on / off > 1", rps("ragged_on") / rps("ragged_off"), 1.0),
        ("overhead: toy / health (batching on) >= 0.6", rps("toy_on") / rps("health_on"), 0.6),
        ("trivial call / health (batching off), req/s", rps("trivial_off") / rps("health_off"), 0.0),
    ]
    for label, value, bar in checks:
        verdict = "meets" if value >= bar else "MISSES"
        print(f"- {label}: {value:.2f}" + (f" ({verdict})" if bar else ""))
    extra = cpu_us_per_call("trivial_off") - cpu_us_per_call("health_off")
    print(f"- the server's CPU per call, trivial call - health (batching off): "
          f"{extra:.1f} µs (decode, the core, the kernel call, encode)")
    bound = max_delay_us / 1e3 + 3 * kernel_ms("medium_on")
    p99 = report["medium_on"]["latency_ms"]["p99"]
    print(f"- medium p99 {p99:.2f} ms vs max delay + 3 batch compute times "
          f"{bound:.2f} ms ({'meets' if p99 < bound else 'MISSES'})")
    p99_off = report["medium_off"]["latency_ms"]["p99"]
    print(f"- medium p99 batching on / off: {p99:.2f} / {p99_off:.2f} ms "
          f"({'no worse' if p99 <= p99_off else 'WORSE'})")


if __name__ == "__main__":
    main()
