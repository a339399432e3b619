#!/usr/bin/env python3
"""Checks the layering docs/architecture.md draws, on the #include
lines of the sources:

- lib/ knows nothing of gRPC, protobuf or the server;
- server/execution/ (the execution stack) knows nothing of gRPC, protobuf, the
  models or the front ends, and names no model kind (its backend, its
  request types, its wire fields);
- server/process/ (the process's own limits: CPU budget, file descriptors,
  allocator) knows no layer above it;
- server/repository/ (bytes on disk) knows nothing of gRPC, the models or
  the front ends (it reads config.pbtxt with protobuf);
- server/models/ (what each kind of model holds, takes and computes) knows
  no wire type and no front end: no gRPC, no attention.v1 or KServe
  message (config.pbtxt's ModelConfig, the repository's storage format, is
  not one);
- server/transport/ (the gRPC and HTTP servers) knows no model and no API:
  nothing of server/models/, server/repository/, the front ends or their
  messages;
- the typed API (server/typed/) and KServe (server/kserve/) do not include
  each other, nor each other's messages;
- client/ talks only to the wire: nothing from server/ or lib/;
- the serving stack is assembled in one place, the execution stack's factory
  (server/execution/execution_stack.h): no WorkerPool, Batcher or CallRunner is
  constructed outside server/execution/ (whose unit tests build the parts).

usage: check_layers.py REPO_ROOT. Exits 1 listing every offending include.
"""
import os
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
GRPC = ("grpc/", "grpcpp/", "grpc++/", "google/protobuf/")
FRONT_ENDS = ("server/transport/", "server/typed/", "server/kserve/",
              "server/api/")
RULES = [
    # (folder, forbidden include prefixes, why[, "code" | "tests": the
    # rule's files, when not all])
    ("lib", GRPC + ("server/", "attention/v1/", "inference/"),
     "the kernel library knows nothing of gRPC or the server"),
    ("server/execution", GRPC + FRONT_ENDS + ("server/models/", "server/repository/",
                                        "attention/v1/", "inference/"),
     "the execution stack knows no protocol and no model"),
    ("server/process", GRPC + FRONT_ENDS + ("server/execution/",
                                            "server/models/",
                                            "server/repository/", "attn/",
                                            "attention/v1/", "inference/"),
     "the process's own limits know no layer above them"),
    # (protobuf it may use: config.pbtxt is a protobuf text message)
    ("server/repository", ("grpc/", "grpcpp/", "grpc++/", "server/models/")
     + FRONT_ENDS,
     "the repository stores bytes: it knows no transport and no model", "code"),
    # Its tests check the repository as the server runs it, with the
    # models' check of every stored model (server/models/model_catalogue.h).
    ("server/repository", ("grpc/", "grpcpp/", "grpc++/") + FRONT_ENDS,
     "the repository's tests know no transport", "tests"),
    ("server/models", ("grpc/", "grpcpp/", "grpc++/", "attention/v1/",
                       "inference/grpc_service") + FRONT_ENDS,
     "the models know no wire type and no front end"),
    ("server/transport", ("server/models/", "server/repository/",
                          "server/typed/", "server/kserve/", "attention/v1/",
                          "inference/"),
     "the transports know no model and no API"),
    ("server/typed", ("server/kserve/", "inference/"),
     "the typed API and KServe do not include each other"),
    ("server/kserve", ("server/typed/", "attention/v1/"),
     "KServe and the typed API do not include each other"),
    ("client", ("server/", "attn/"),
     "the client talks only to the wire"),
]


def sources(top, suffixes):
    """The source files under top, in order, never entering a build tree or
    .git: other tests create and delete virtual environments under build/
    while this one runs, so listing a build tree races with them."""
    found = []
    for folder, subfolders, names in os.walk(top):
        subfolders[:] = [name for name in subfolders
                         if name not in ("build", ".git")
                         and not name.startswith("build-")]
        found += [pathlib.Path(folder) / name for name in names
                  if os.path.splitext(name)[1] in suffixes]
    return sorted(found)


def main():
    root = pathlib.Path(sys.argv[1])
    errors, files = [], 0
    for folder, forbidden, why, *scope in RULES:
        for path in sources(root / folder, (".h", ".cc", ".cu")):
            # A rule for the code alone (its tests exempt), or for tests alone.
            is_test = path.name.endswith("_test.cc")
            if (scope == ["code"] and is_test) or (scope == ["tests"] and not is_test):
                continue
            files += 1
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if match and match.group(1).startswith(forbidden):
                    errors.append(f"{path.relative_to(root)}:{number}: "
                                  f"#include {match.group(1)}: {why}")
    # Only the execution stack's factory assembles a stack.
    assembly = re.compile(r"\b(?:WorkerPool::Create|Batcher::Create|"
                          r"make_unique<(?:attnserve::)?CallRunner>|"
                          r"CallRunner\s+\w+\s*\()")
    for path in sources(root, (".h", ".cc")):
        relative = path.relative_to(root)
        if relative.parts[:2] == ("server", "execution"):
            continue
        files += 1
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if assembly.search(line):
                errors.append(f"{relative}:{number}: {line.strip()}: assemble the "
                              "serving stack with ExecutionStack::Create "
                              "(server/execution/execution_stack.h)")
    # The execution stack knows no model kind: a kind's backend, request
    # types or wire fields named in one of its sources (not its tests, which
    # build requests as a kind would) means a kind reached into it.
    kind_names = re.compile(
        r"\b(?:attention_memory|additive_attention|memory_name|weights_name|"
        r"model_name)\b|\b(?:AttentionMemory|MemoryAttention|StoredRegression|"
        r"FittedNadarayaWatson|TrainedNadarayaWatson|ModelKind)")
    for path in sources(root / "server" / "execution", (".h", ".cc")):
        if path.name.endswith("_test.cc"):
            continue
        files += 1
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = kind_names.search(line)
            if match:
                errors.append(f"{path.relative_to(root)}:{number}: "
                              f"{match.group(0)}: the execution stack knows "
                              "no model kind; a kind lives in server/models/")
    for error in errors:
        print(error)
    print(f"{files} files, {len(errors)} layering violations")
    sys.exit(1 if errors or files == 0 else 0)


if __name__ == "__main__":
    main()
