#!/usr/bin/env python3
"""kill -9 during appends, evictions and compactions: is every acknowledged
row still there after the restart, in its place, every acknowledged
eviction kept, and never a part of either?

    tests/faults/append_crash.py [--rounds=50] [--attnserve=PATH]
                                 [--attnctl=PATH] [--seed=1]

One attnserve over an empty repository, compacting in the background as it
does by default. Each round starts it, checks what it serves, then changes
the memory `crash` from one client, each call answered before the next is
sent: mostly appends (attnctl append, 1 to 512 rows), and one call in five
an eviction of up to 512 of the oldest rows (attnctl evict). It kills the
server with SIGKILL at a random moment 50-600 ms in, most often while a
change is being written (and, as the memory grows, while a compaction
runs). The value appended as row i is [i] x 32 under key [i], and the memory
scores with a sharp Gaussian (scale 100), so a query [j] answers j exactly
when the row appended as j holds its own values and nothing else does.

After each restart the server must come up serving, and the memory must
hold exactly the rows acknowledged so far (appended, less those evicted),
or that with the whole change that was in flight when the server died
applied (its answer was lost, not its effect): never a part of one. A query
of each of the newest 600 rows and of up to 1,400 others must answer its
own index. The first append of the first round makes the memory. The end
says how many compactions ran (the server's log). Exit 0 when every round
passed; standard library only; build first.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NAME = "crash"
# Each value row is its index repeated: wide enough that a compaction of
# the memory takes long enough for kills to land in it too.
VALUE_WIDTH = 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, repository, log):
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.process = subprocess.Popen(
            [binary, "--host=127.0.0.1", "--grpc_port=%d" % self.grpc,
             "--http_port=%d" % self.http, "--metrics_port=%d" % self.metrics,
             "--model_repository=" + repository, "--backend=cpu",
             "--drain_notice_ms=0"],
            stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, seconds=20):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(
                        "http://127.0.0.1:%d/v2/health/ready" % self.http,
                        timeout=2) as reply:
                    if reply.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def served_rows(self):
        """The memory's rows as its metadata says (attention_weights'
        last dimension); 0 when it is not served."""
        try:
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/v2/models/%s" % (self.http, NAME),
                    timeout=10) as reply:
                metadata = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return 0
            raise
        for output in metadata["outputs"]:
            if output["name"] == "attention_weights":
                return int(output["shape"][-1])
        raise RuntimeError("no attention_weights in %r" % metadata)


def attnctl(tool, port, subcommand, request, workdir, deadline="30s"):
    """Runs `attnctl SUBCOMMAND --input` with `request` (a dict); returns
    (exit status, parsed stdout or None, stderr)."""
    path = os.path.join(workdir, subcommand + ".json")
    with open(path, "w") as out:
        json.dump(request, out)
    done = subprocess.run(
        [tool, "--target=127.0.0.1:%d" % port, "--deadline=" + deadline,
         "--input=" + path, subcommand],
        capture_output=True, text=True)
    body = None
    if done.returncode == 0:
        body = json.loads(done.stdout)
    return done.returncode, body, done.stderr


def check_rows(tool, server, first, end, rng, workdir):
    """Queries the newest 600 of the rows appended as [first, end) and up to
    1,400 others; the rows whose answer is not their own index."""
    wanted = set(range(max(first, end - 600), end))
    wanted.update(rng.sample(range(first, end), min(end - first, 1400)))
    wanted = sorted(wanted)
    status, body, error = attnctl(tool, server.grpc, "attention", {
        "memory_name": NAME,
        "queries": {"shape": [1, len(wanted), 1], "values": wanted},
    }, workdir)
    if status != 0:
        raise RuntimeError("query failed: " + error.strip())
    got = body["output"]["values"][::VALUE_WIDTH]  # each row's first value
    return [j for j, value in zip(wanted, got) if abs(value - j) > 1e-3 * max(1, j)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--attnserve",
                        default=os.path.join(REPO, "build/server/attnserve"))
    parser.add_argument("--attnctl",
                        default=os.path.join(REPO, "build/client/attnctl"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = tempfile.mkdtemp(prefix="attnserve-append-crash.")
    repository = os.path.join(workdir, "models")
    os.mkdir(repository)
    log = open(os.path.join(workdir, "server.log"), "ab")

    # Rows appended as [first, end) are held, as acknowledged so far.
    first = end = 0
    in_flight = None   # ("append", n) or ("evict", k): the change the kill cut
    failures = []
    appends = evictions = 0
    cut_compactions = set()  # what compactions cut by a kill left
    for round_number in range(1, args.rounds + 1):
        # A kill inside a compaction leaves its hidden base, or a base
        # beside the files it covers (weights.safetensors, an older base).
        folder = os.path.join(repository, NAME)
        files = os.listdir(folder) if os.path.isdir(folder) else []
        bases = [f for f in files if f.startswith("base-")]
        # (Each stays until a start ten minutes on, or the next compaction.)
        cut_compactions.update(f for f in files if f.startswith(".base-"))
        if bases and (len(bases) > 1 or "weights.safetensors" in files):
            cut_compactions.add(max(bases))
        server = Server(args.attnserve, repository, log)
        if not server.wait_ready():
            failures.append("round %d: the server did not come up (%s)" % (
                round_number, os.path.join(workdir, "server.log")))
            break
        rows = server.served_rows()
        # Before or after the change in flight, whole.
        outcomes = [(first, end)]
        if in_flight and in_flight[0] == "append":
            outcomes.append((first, end + in_flight[1]))
        elif in_flight:
            outcomes.append((first + in_flight[1], end))
        held = [(a, b) for a, b in outcomes if b - a == rows]
        if not held:
            failures.append("round %d: %d rows served; %d acknowledged%s" % (
                round_number, rows, end - first,
                " (%s of %d in flight)" % in_flight if in_flight else ""))
        else:
            survived = held[-1] != outcomes[0]
            first, end = held[-1]
            if rows:
                wrong = check_rows(args.attnctl, server, first, end, rng,
                                   workdir)
                if wrong:
                    failures.append("round %d: rows %s do not hold their "
                                    "values" % (round_number, wrong[:10]))
        in_flight = None

        # The kill, at a random moment.
        killer = threading.Timer(rng.uniform(0.05, 0.6),
                                 lambda: server.process.send_signal(signal.SIGKILL))
        killer.start()
        while not failures and server.process.poll() is None:
            if end - first > 2 and rng.random() < 0.2:
                k = rng.randint(1, min(512, end - first - 1))
                status, body, error = attnctl(args.attnctl, server.grpc, "evict",
                                              {"name": NAME, "oldest": k},
                                              workdir)
                if status == 0:
                    evictions += 1
                    if int(body["rows"]) != end - first - k:
                        failures.append("round %d: evict answered %s rows, "
                                        "expected %d" % (round_number,
                                                         body["rows"],
                                                         end - first - k))
                    first += k
                    continue
                change = ("evict", k)
            else:
                n = rng.randint(1, 512)
                keys = [float(i) for i in range(end, end + n)]
                request = {"name": NAME,
                           "keys": {"shape": [n, 1], "values": keys},
                           "values": {"shape": [n, VALUE_WIDTH], "values": [
                               key for key in keys for _ in range(VALUE_WIDTH)]}}
                if end == 0:
                    request["create"] = {"score": "SCORE_GAUSSIAN", "scale": 100}
                status, body, error = attnctl(args.attnctl, server.grpc,
                                              "append", request, workdir)
                if status == 0:
                    appends += 1
                    at, total = int(body.get("first_row", 0)), int(body["rows"])
                    if at != end - first or total != end + n - first:
                        failures.append("round %d: append answered rows %d-%d, "
                                        "expected %d-%d" % (
                                            round_number, at, total,
                                            end - first, end + n - first))
                    end += n
                    continue
                change = ("append", n)
            if server.process.poll() is not None or "UNAVAILABLE" in error:
                in_flight = change
            else:
                failures.append("round %d: %s failed: %s" % (
                    round_number, change[0], error.strip()))
            break
        killer.join()
        server.process.wait()
        print("round %2d: served %6d rows at the restart%s, then rows %d-%d "
              "acknowledged%s" % (
                  round_number, rows,
                  " (with the change cut by the kill)" if held and survived else "",
                  first, end,
                  ", killed during an %s of %d" % in_flight if in_flight else ""),
              flush=True)
        if failures:
            break

    # The last restart: everything acknowledged is served.
    if not failures:
        server = Server(args.attnserve, repository, log)
        if not server.wait_ready():
            failures.append("the last restart did not come up")
        else:
            rows = server.served_rows()
            outcomes = [end - first]
            if in_flight:
                outcomes.append(end - first + (in_flight[1] if in_flight[0] ==
                                               "append" else -in_flight[1]))
            if rows not in outcomes:
                failures.append("last restart: %d rows served; %d acknowledged" % (
                    rows, end - first))
            elif rows == end - first and check_rows(args.attnctl, server, first,
                                                    end, rng, workdir):
                failures.append("last restart: rows do not hold their values")
            server.process.send_signal(signal.SIGTERM)
            if server.process.wait(timeout=30) != 0:
                failures.append("the server did not exit 0 on SIGTERM")
    log.close()
    with open(os.path.join(workdir, "server.log"), errors="replace") as read:
        compactions = sum("compacted" in line for line in read)
    print("append_crash: %d rounds, %d appends and %d evictions answered OK, "
          "rows %d-%d held, %d compactions ran, %d cut by a kill" % (
              args.rounds, appends, evictions, first, end, compactions,
              len(cut_compactions)))
    if failures:
        for failure in failures:
            print("FAIL " + failure)
        print("append_crash: failed; the server's log: %s" % (
            os.path.join(workdir, "server.log")))
        return 1
    print("append_crash: passed: 0 acknowledged rows lost, 0 partial "
          "changes")
    subprocess.run(["rm", "-rf", workdir])
    return 0


if __name__ == "__main__":
    sys.exit(main())
