#!/usr/bin/env python3
"""Helpers of bench/serving_peers.sh (stdlib, and numpy for `check`); `data`
also makes bench/perf_analyzer.sh's input.

  peers.py data DIR                      perf_analyzer input data: DIR/toy.json, DIR/medium.json
  peers.py check DIR HOST:PORT HOST:PORT one request per case to each server's HTTP port; exits 1
                                         unless the outputs agree within 1e-5
  peers.py cpu PID                       CPU seconds (user + system) of PID and its descendants
  peers.py count-attnserve HOST:PORT     attnserve's successful dot_product_attention inferences (its /metrics)
  peers.py errors-attnserve HOST:PORT    attnserve's failed dot_product_attention calls, by code
  peers.py count-triton HOST:PORT        Triton's successful inferences of the model (its
                                         statistics endpoint, on its HTTP port)
  peers.py row CSV CASE PROTOCOL SERVER CPU0 CPU1 N0 N1
                                         one markdown row from perf_analyzer's CSV
"""
import csv
import json
import os
import random
import sys
import urllib.request

MODEL = "dot_product_attention"


def data(folder):
    # Per batch item, without the batch dimension (perf_analyzer's form);
    # 32 entries per case, valid lengths from 1 to Lk.
    random.seed(0)
    r = lambda n: [round(random.gauss(0, 1), 4) for _ in range(n)]  # noqa: E731

    def case(lq, lk, d, v, lengths):
        return {"data": [{"queries": {"content": r(lq * d), "shape": [lq, d]},
                          "keys": {"content": r(lk * d), "shape": [lk, d]},
                          "values": {"content": r(lk * v), "shape": [lk, v]},
                          "valid_lens": {"content": [random.randint(*lengths)], "shape": [1]}}
                         for _ in range(32)]}
    json.dump(case(1, 10, 2, 4, (1, 10)), open(os.path.join(folder, "toy.json"), "w"))
    json.dump(case(64, 64, 64, 64, (1, 64)), open(os.path.join(folder, "medium.json"), "w"))


def get(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def infer(address, entry):
    """One KServe v2 JSON request (batch of 1) -> the output as a flat list."""
    body = {"inputs": [
        {"name": name, "datatype": "INT32" if name == "valid_lens" else "FP32",
         "shape": [1] + tensor["shape"], "data": tensor["content"]}
        for name, tensor in entry.items()],
        "outputs": [{"name": "output"}]}
    request = urllib.request.Request(
        f"http://{address}/v2/models/{MODEL}/infer", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    (output,) = [o for o in answer["outputs"] if o["name"] == "output"]
    return output["shape"], output["data"]


def check(folder, attnserve, triton):
    import numpy as np
    ok = True
    for case in ("toy", "medium"):
        entry = json.load(open(os.path.join(folder, f"{case}.json")))["data"][0]
        shape_a, a = infer(attnserve, entry)
        shape_t, t = infer(triton, entry)
        a = np.asarray(a, np.float32).reshape(shape_a)
        t = np.asarray(t, np.float32).reshape(shape_t)
        same = shape_a == shape_t and np.all(np.isfinite(t))
        diff = float(np.max(np.abs(a - t))) if same else float("inf")
        good = same and diff <= 1e-5
        ok &= good
        print(f"check {case}: output {shape_a} (attnserve) vs {shape_t} (Triton), "
              f"valid_lens {entry['valid_lens']['content']}, max |difference| {diff:.2e}: "
              f"{'ok' if good else 'MISMATCH (limit 1e-5)'}", file=sys.stderr)
    sys.exit(0 if ok else 1)


def cpu(root):
    """User + system seconds of root and every live descendant (all threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, ticks = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = int(fields[11]) + int(fields[12])  # utime, stime
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        grew = bool(more)
        tree |= more
    print(f"{sum(ticks.get(p, 0) for p in tree) / tick:.6f}")


def count_attnserve(address):
    n = 0
    for line in get(f"http://{address}/metrics").splitlines():
        if (line.startswith("attnserve_requests_total{") and 'rpc="ScaledDotProductAttention"' in line
                and 'code="OK"' in line):
            n += int(float(line.split()[-1]))
    print(n)


def errors_attnserve(address):
    """attnserve's failed dot_product_attention calls, by protocol and code."""
    for line in get(f"http://{address}/metrics").splitlines():
        if (line.startswith("attnserve_requests_total{") and 'rpc="ScaledDotProductAttention"' in line
                and 'code="OK"' not in line and float(line.split()[-1]) > 0):
            print(line)


def count_triton(address):
    stats = json.loads(get(f"http://{address}/v2/models/{MODEL}/stats"))
    print(sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"]))


def row(path, case, protocol, server, cpu0, cpu1, n0, n1):
    seconds = float(cpu1) - float(cpu0)
    requests = int(n1) - int(n0)
    # Over the whole perf_analyzer run (every trial).
    per_infer = f"{1e6 * seconds / requests:.0f}" if requests > 0 else "-"
    for r in csv.DictReader(open(path)):
        print(f"| {case} | {protocol} | {server} | {float(r['Inferences/Second']):.0f} | "
              f"{int(r['p50 latency']) / 1e3:.2f} | {int(r['p99 latency']) / 1e3:.2f} | "
              f"{per_infer} |")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"data": data, "check": check, "cpu": lambda pid: cpu(int(pid)),
     "count-attnserve": count_attnserve, "errors-attnserve": errors_attnserve, "count-triton": count_triton, "row": row}[command](*args)
