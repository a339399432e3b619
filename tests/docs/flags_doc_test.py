#!/usr/bin/env python3
"""docs/flags.md against `attnserve --helpfull`: every flag the binary has is
documented, every documented flag still exists, and each documented default
is the one --helpfull prints.

    flags_doc_test.py ATTNSERVE [FLAGS_MD]

docs/flags.md documents a flag as a table row whose first cell is the flag
in a code span (| `--name` | default | meaning | when |). The default cell's
first code span is the default exactly as --helpfull prints it (`"auto"`,
`""`, `1000`, `false`); a cell without a code span that reads "(empty)"
stands for an empty default (--helpfull's `default: ;`). Anything after
the code span is commentary for the reader and is not compared. Only the
standard library: runs under Debian's /usr/bin/python3. Exits 1 listing
every difference.
"""

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def helpfull_flags(binary):
    """{name: default} from `binary --helpfull` (absl's format)."""
    run = subprocess.run([binary, "--helpfull"], capture_output=True,
                         text=True, timeout=60)
    text = run.stdout + run.stderr
    flags = {}
    # Each flag starts a line "    --name (help...); default: VALUE;" and
    # its help may wrap over several lines.
    entries = re.split(r"\n(?=    --)", text)
    for entry in entries:
        entry = entry.strip()
        if not entry.startswith("--"):
            continue
        entry = entry.split("\n\n")[0]  # the blank line before the next group
        name = re.match(r"--([A-Za-z0-9_]+)", entry).group(1)
        joined = re.sub(r"\s*\n\s*", " ", entry)
        found = re.search(r"; default: (.*);$", joined)
        if found is None:
            raise SystemExit(f"flags_doc_test: cannot read the default of "
                             f"--{name} in: {joined!r}")
        flags[name] = found.group(1).strip()
    return flags


def documented_flags(markdown):
    """{name: (default, line number)} from the flag tables of flags.md."""
    flags = {}
    duplicates = []
    for number, line in enumerate(markdown.split("\n"), start=1):
        row = re.match(r"\|\s*`--([A-Za-z0-9_]+)`\s*\|([^|]*)\|", line)
        if row is None:
            continue
        name, cell = row.group(1), row.group(2).strip()
        span = re.search(r"`([^`]*)`", cell)
        if span is not None:
            default = span.group(1)
        elif cell.startswith("(empty)"):
            default = ""
        else:
            default = None  # reported below
        if name in flags:
            duplicates.append(f"--{name} documented twice (lines "
                              f"{flags[name][1]} and {number})")
        flags[name] = (default, number)
    return flags, duplicates


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 64
    binary = sys.argv[1]
    doc = pathlib.Path(sys.argv[2]) if len(sys.argv) == 3 else REPO / "docs/flags.md"
    actual = helpfull_flags(binary)
    if len(actual) < 10:
        print(f"FAIL --helpfull listed only {len(actual)} flags: is {binary} "
              f"attnserve?")
        return 1
    documented, problems = documented_flags(doc.read_text())
    for name in sorted(actual):
        if name not in documented:
            problems.append(f"--{name} (default {actual[name]!r}) is not in "
                            f"{doc.name}")
    for name, (default, line) in sorted(documented.items()):
        if name not in actual:
            problems.append(f"--{name} ({doc.name}:{line}) is no flag of "
                            f"attnserve any more")
        elif default is None:
            problems.append(f"--{name} ({doc.name}:{line}): the default cell "
                            f"has no code span (nor reads '(empty)')")
        elif default != actual[name]:
            problems.append(f"--{name} ({doc.name}:{line}): documented default "
                            f"{default!r}, --helpfull says {actual[name]!r}")
    for problem in problems:
        print("FAIL " + problem)
    print(f"flags_doc_test: {len(actual)} flags in --helpfull, "
          f"{len(documented)} documented: "
          f"{'passed' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
