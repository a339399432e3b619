#!/usr/bin/env python3
"""The command blocks the documentation presents as real output are run.

    readme_commands.py static README
    readme_commands.py run ATTNCTL TARGET FILE...

`static`: every `$ ` command line that README.md shows (indented or fenced
blocks) is one a test runs: `$ curl` lines in its section "### KServe v2 over
HTTP/REST" (tests/e2e/http_defences.py readme, in e2e_http_defences_test)
and `$ build/client/attnctl` lines (`run`, below). Any other `$ ` line fails:
a command shown with its output that nothing checks.

`run`: runs each `    $ build/client/attnctl ...` line of each FILE (a
4-space indented block; a trailing backslash continues the command on the
next line; the output is the indented lines that follow, up to a blank
line or the next `$ `) with ATTNCTL and `--target TARGET`, and compares
what it prints (stdout and stderr together) with the file's: JSON field by
field, numbers within 1e-6 (another CPU may round the last bits
differently), timings (`*_seconds`) not compared; other text exactly.

Only the standard library: runs under Debian's /usr/bin/python3. Prints
"ok ..." or "FAIL ..." per check and exits 1 on any failure.
"""

import json
import math
import re
import shlex
import subprocess
import sys

HTTP_HEADING = "### KServe v2 over HTTP/REST"
ATTNCTL = "build/client/attnctl"

failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures += 1


def shown_commands(lines):
    """(line index, command, expected output lines) of indented `$ ` lines."""
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    $ "):
            start = i
            command = line[6:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            expected = []
            while (i + 1 < len(lines) and lines[i + 1].startswith("    ")
                   and not lines[i + 1].startswith("    $ ")):
                i += 1
                expected.append(lines[i][4:])
            found.append((start, " ".join(command.split()), expected))
        i += 1
    return found


def static(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    # Fenced blocks may show commands too.
    fenced = False
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and line.lstrip().startswith("$ "):
            check(f"README:{number}: `{line.strip()[:60]}` is run by a test",
                  False, "a fenced `$ ` line: show real output in an indented "
                  "block that tests/docs/readme_commands.py or "
                  "tests/e2e/http_defences.py runs")
    http_start = lines.index(HTTP_HEADING) if HTTP_HEADING in lines else None
    http_end = None
    if http_start is not None:
        http_end = next((j for j in range(http_start + 1, len(lines))
                         if lines[j].startswith("#")), len(lines))
    check(f"README has the section '{HTTP_HEADING}' whose curl lines "
          f"e2e_http_defences_test runs", http_start is not None)
    curl_lines = 0
    for index, command, _ in shown_commands(lines):
        where = f"README:{index + 1}: `{command[:60]}`"
        if command.startswith(ATTNCTL + " "):
            check(f"{where} is run by readme_commands_test", True)
        elif (command.startswith("curl ") and http_start is not None
              and http_start < index < http_end):
            curl_lines += 1
            check(f"{where} is run by e2e_http_defences_test", True)
        else:
            check(f"{where} is run by a test", False,
                  "the README shows it as real output but no test runs it")
    check("README shows curl lines in its HTTP section", curl_lines >= 2,
          str(curl_lines))


def same_json(want, got, key=""):
    if key.endswith("_seconds"):
        return isinstance(got, (int, float))
    if isinstance(want, bool) or isinstance(got, bool):
        return want == got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(want, list):
        return (isinstance(got, list) and len(want) == len(got)
                and all(same_json(w, g, key) for w, g in zip(want, got)))
    if isinstance(want, dict):
        return (isinstance(got, dict) and want.keys() == got.keys()
                and all(same_json(want[k], got[k], k) for k in want))
    return want == got


def run(attnctl, target, paths):
    for path in paths:
        lines = open(path, encoding="utf-8").read().split("\n")
        commands = [c for c in shown_commands(lines)
                    if c[1].startswith(ATTNCTL + " ")]
        check(f"{path}: shows attnctl commands", len(commands) >= 1)
        for index, command, expected in commands:
            argv = shlex.split(command)
            argv = [attnctl, "--target", target] + argv[1:]
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=60)
            out = (done.stdout + done.stderr).strip()
            want = "\n".join(expected).strip()
            try:
                ok = same_json(json.loads(want), json.loads(out))
            except ValueError:
                ok = out == want
            check(f"{path}:{index + 1}: `{command[:70]}` prints what is "
                  f"shown", ok, f"got {out[:300]!r}, shown {want[:300]!r}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "static":
        static(sys.argv[2])
    elif len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    sys.exit(1 if failures else 0)
