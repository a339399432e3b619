"""Prints a sample's value from a Prometheus text exposition.

  /usr/bin/python3 tests/e2e/metric.py FILE NAME [LABEL=VALUE ...]

Sums every series of NAME whose labels include all LABEL=VALUE pairs (label
order does not matter); prints the sum as an integer when it is one, or
"absent" (exit 1) when no series matches. Standard library only.
"""

import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def main(argv):
    path, name, wanted = argv[0], argv[1], dict(a.split("=", 1) for a in argv[2:])
    total, found = 0.0, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = SAMPLE.match(line)
            if not match or match.group(1) != name:
                continue
            labels = dict(LABEL.findall(match.group(2) or ""))
            if all(labels.get(k) == v for k, v in wanted.items()):
                total += float(match.group(3))
                found = True
    if not found:
        print("absent")
        return 1
    print(int(total) if total.is_integer() else total)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
