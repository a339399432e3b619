#!/usr/bin/env python3
"""A mixed soak of the stored-model surface, with idle gaps: is anonymous
memory on a plateau, or does it climb?

    tests/faults/memory_soak.py [--duration=1800] [--busy=40] [--idle=20]
                                [--attnserve=PATH] [--attnctl=PATH]

Starts one attnserve (explicit model control) over a repository of three
attention memories (F32 65,536 x 64, BF16 65,536 x 64, a Gaussian-score
F32 16,384 x 16), then runs cycles of --busy seconds of load and --idle
seconds of nothing until --duration has passed. In each busy phase:
  - `attnctl load` on each memory at once (12, 6 and 4 calls in flight),
    single-query calls through the typed API; every call must end OK, or
    NOT_FOUND on the BF16 memory while it is unloaded;
  - the F32 memory replaced by an upload of new bytes every 10 s, over
    KServe REST (the path that costs most memory);
  - the BF16 memory unloaded and loaded again every 20 s;
  - a refused upload (bytes that are not safetensors) every 5 s.
The server's anonymous memory (RssAnon) is read at the end of every idle
phase and sampled every second while busy.

Passes when no call ended with another code, every upload and reload was
answered as expected, the server exits 0 on SIGTERM, and anonymous memory
is on a plateau: the highest idle-end reading of the last third of the
cycles is at most max(10%, 32 MiB) above the highest of the first third
(the first cycle, the warm-up, left out). Prints one row per cycle and the
verdict; exit 0 when all passed. Standard library only; build first.
"""
import argparse
import array
import base64
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def safetensors(tensors):
    """tensors: [(name, dtype, shape, bytes)] -> the file's bytes."""
    header, data = {}, b""
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def floats(count, rng):
    block = array.array("f", (rng.gauss(0, 1) for _ in range(4096)))
    data = block * (count // len(block) + 1)
    return data[:count].tobytes()


def bfloat16(blob):
    words = array.array("I", blob)
    return array.array(
        "H", ((w + 0x7FFF + ((w >> 16) & 1)) >> 16 for w in words)).tobytes()


def memory_file(n, d, rng, dtype="F32"):
    keys, values = floats(n * d, rng), floats(n * d, rng)
    if dtype == "BF16":
        keys, values = bfloat16(keys), bfloat16(values)
    return safetensors([("keys", dtype, [n, d], keys),
                        ("values", dtype, [n, d], values)])


def write_model(root, name, config, weights):
    folder = os.path.join(root, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write(config)
    with open(os.path.join(folder, "weights.safetensors"), "wb") as f:
        f.write(weights)


def anon_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class Server:
    def __init__(self, binary, repository, log):
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.process = subprocess.Popen(
            [binary, "--host=127.0.0.1", "--grpc_port=%d" % self.grpc,
             "--http_port=%d" % self.http, "--metrics_port=%d" % self.metrics,
             "--model_repository=" + repository, "--model_control_mode=explicit",
             "--backend=cpu", "--drain_notice_ms=0"],
            stdout=log, stderr=subprocess.STDOUT)

    def post(self, path, body=None):
        request = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (self.http, path),
            data=json.dumps(body or {}).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def ready(self):
        try:
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/v2/health/ready" % self.http,
                    timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=1800)
    parser.add_argument("--busy", type=int, default=40)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--attnserve",
                        default=os.environ.get("ATTNSERVE",
                                               os.path.join(REPO, "build/server/attnserve")))
    parser.add_argument("--attnctl",
                        default=os.environ.get("ATTNCTL",
                                               os.path.join(REPO, "build/client/attnctl")))
    args = parser.parse_args()
    cycles = max(3, args.duration // (args.busy + args.idle))
    rng = random.Random(46)
    work = tempfile.mkdtemp(prefix="attnserve-memory-soak.")
    repository = os.path.join(work, "models")
    memory = 'backend: "attention_memory"\n'
    write_model(repository, "f32", 'name: "f32"\n' + memory,
                memory_file(65536, 64, rng))
    write_model(repository, "bf16", 'name: "bf16"\n' + memory,
                memory_file(65536, 64, rng, "BF16"))
    write_model(repository, "gauss",
                'name: "gauss"\n' + memory +
                'parameters { key: "score" value { string_value: "gaussian" } }\n',
                memory_file(16384, 16, rng))
    uploads = [memory_file(65536, 64, random.Random(seed)) for seed in (1, 2)]
    config = json.dumps({"name": "f32", "backend": "attention_memory"})

    log = open(os.path.join(work, "server.log"), "w")
    server = Server(args.attnserve, repository, log)
    for _ in range(300):
        if server.ready():
            break
        time.sleep(0.1)
    else:
        sys.exit("memory_soak: attnserve did not become ready; log in " + work)
    pid = server.process.pid
    failures = []

    def mutate(stop):
        """The busy phase's model changes, until `stop` is set."""
        tick = 0
        while not stop.wait(5):
            tick += 5
            status, body = server.post(
                "/v2/repository/models/f32/load",
                {"parameters": {"config": config,
                                "file:weights.safetensors":
                                    base64.b64encode(b"not safetensors").decode()}})
            if status != 400:
                failures.append("bad upload answered %d: %s" % (status, body[:200]))
            if tick % 10 == 0:
                weights = uploads[(tick // 10) % 2]
                status, body = server.post(
                    "/v2/repository/models/f32/load",
                    {"parameters": {"config": config,
                                    "file:weights.safetensors":
                                        base64.b64encode(weights).decode()}})
                if status != 200:
                    failures.append("upload answered %d: %s" % (status, body[:200]))
            if tick % 20 == 0:
                for action in ("unload", "load"):
                    status, body = server.post(
                        "/v2/repository/models/bf16/" + action)
                    if status != 200:
                        failures.append("%s bf16 answered %d: %s" %
                                        (action, status, body[:200]))
                    if action == "unload":
                        stop.wait(1)

    loads = [("f32", "1x1x64", 12, "OK"), ("bf16", "1x1x64", 6, "OK,NOT_FOUND"),
             ("gauss", "1x1x16", 4, "OK")]
    rows = []
    print("| cycle | minute | answers | busy peak anon MiB | idle-end anon MiB |")
    print("|---:|---:|---:|---:|---:|")
    start = time.time()
    for cycle in range(cycles):
        stop = threading.Event()
        mutator = threading.Thread(target=mutate, args=(stop,))
        mutator.start()
        processes = [subprocess.Popen(
            [args.attnctl, "--target=127.0.0.1:%d" % server.grpc, "--deadline=30s",
             "load", "--rpc=attention", "--memory_name=" + name,
             "--shape=queries=" + shape, "--concurrency=%d" % concurrency,
             "--duration=%ds" % args.busy, "--expect_codes=" + codes,
             "--output_format=json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, shape, concurrency, codes in loads]
        peak = 0
        while any(p.poll() is None for p in processes):
            peak = max(peak, anon_kib(pid))
            time.sleep(1)
        stop.set()
        mutator.join()
        answers = 0
        for (name, _, _, _), process in zip(loads, processes):
            out, err = process.communicate()
            if process.returncode != 0:
                failures.append("cycle %d: load on %s exited %d: %s" %
                                (cycle, name, process.returncode, err.strip()[:300]))
                continue
            answers += json.loads(out)["requests"]
        if server.process.poll() is not None:
            failures.append("the server died in cycle %d" % cycle)
            break
        time.sleep(args.idle)
        idle = anon_kib(pid)
        rows.append(idle)
        print("| %d | %.1f | %d | %.0f | %.0f |" % (
            cycle, (time.time() - start) / 60, answers, peak / 1024, idle / 1024),
            flush=True)

    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        code = "hung"
    if code != 0:
        failures.append("SIGTERM: exit %s" % code)
    third = max(1, (len(rows) - 1) // 3)
    first, last = rows[1:1 + third], rows[-third:]
    if first and last:
        allowed = max(first) + max(0.10 * max(first), 32 * 1024)
        print("idle-end anon: first third's highest %.0f MiB, last third's %.0f MiB,"
              " allowed %.0f MiB" % (max(first) / 1024, max(last) / 1024,
                                     allowed / 1024))
        if max(last) > allowed:
            failures.append("anonymous memory climbed: %.0f MiB > %.0f MiB" %
                            (max(last) / 1024, allowed / 1024))
    for failure in failures:
        print("FAIL " + failure)
    print("memory_soak: %s (server log: %s)" %
          ("PASS" if not failures else "FAIL", os.path.join(work, "server.log")))
    sys.exit(0 if not failures else 1)


main()
