#!/usr/bin/env python3
"""Checks the layering docs/architecture.md draws, on the #include
lines of the sources:

- lib/ knows nothing of gRPC, protobuf or the server;
- server/core/ (the serving core) knows nothing of gRPC, protobuf or the
  front ends in server/api/;
- server/repository/ knows nothing of gRPC or the front ends (it reads
  config.pbtxt with protobuf);
- client/ talks only to the wire: nothing from server/ or lib/;
- the serving stack is assembled in one place, the core's factory
  (server/core/server_core.h): no WorkerPool, Batcher or CallRunner is
  constructed outside server/core/ (whose unit tests build the parts).

usage: check_layers.py REPO_ROOT. Exits 1 listing every offending include.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
GRPC = ("grpc/", "grpcpp/", "grpc++/", "google/protobuf/")
RULES = [
    # (folder, forbidden include prefixes, why)
    ("lib", GRPC + ("server/", "attention/v1/", "inference/"),
     "the kernel library knows nothing of gRPC or the server"),
    ("server/core", GRPC + ("server/api/", "attention/v1/", "inference/"),
     "the serving core knows no protocol"),
    # (protobuf it may use: config.pbtxt is a protobuf text message)
    ("server/repository", ("grpc/", "grpcpp/", "grpc++/", "server/api/"),
     "the repository knows no transport"),
    ("client", ("server/", "attn/"),
     "the client talks only to the wire"),
]


def main():
    root = pathlib.Path(sys.argv[1])
    errors, files = [], 0
    for folder, forbidden, why in RULES:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu") or "build" in path.parts:
                continue
            files += 1
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if match and match.group(1).startswith(forbidden):
                    errors.append(f"{path.relative_to(root)}:{number}: "
                                  f"#include {match.group(1)}: {why}")
    # Only the core's factory assembles a stack.
    assembly = re.compile(r"\b(?:WorkerPool::Create|Batcher::Create|"
                          r"make_unique<(?:attnserve::)?CallRunner>|"
                          r"CallRunner\s+\w+\s*\()")
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cc") or any(
                part in ("build", ".git") or part.startswith("build-")
                for part in path.relative_to(root).parts):
            continue
        relative = path.relative_to(root)
        if relative.parts[:2] == ("server", "core"):
            continue
        files += 1
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if assembly.search(line):
                errors.append(f"{relative}:{number}: {line.strip()}: assemble the "
                              "serving stack with ServerCore::Create "
                              "(server/core/server_core.h)")
    for error in errors:
        print(error)
    print(f"{files} files, {len(errors)} layering violations")
    sys.exit(1 if errors or files == 0 else 0)


if __name__ == "__main__":
    main()
