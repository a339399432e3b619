"""Build step of the attnserve client: generates the gRPC stubs.

Everything declarative lives in pyproject.toml; this file adds what a
declarative file cannot:

- ``build_py`` also writes ``attnserve/_generated/``, made from the .proto
  files by grpcio-tools (a build requirement, so this works offline from
  wheels already installed or found with ``--find-links``):
  ``attention_pb2.py``, ``.pyi`` and ``attention_pb2_grpc.py`` for the typed
  API (its import rewritten to be relative, so no top-level ``attention``
  package is installed), and ``services.binpb``, a descriptor set of the
  health and KServe protos that the client loads into a private descriptor
  pool (so it never clashes with tritonclient's or grpcio-health-checking's
  own copies of those messages in the default pool).
- the dependencies: the stubs need ``grpcio >=`` the grpcio-tools version and
  ``protobuf >=`` the version of the protoc that generated them, within that
  protobuf major version, so the pins are read from the generator at hand.
- ``sdist`` copies the .proto files into the archive (``proto/``), so an
  sdist builds on its own.

The .proto files are looked up in $ATTNSERVE_PROTO_DIR, then ./proto (an
sdist), then ../../proto (this repository).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
TYPED_API = "attention/v1/attention.proto"
SERVICES = ("grpc/health/v1/health.proto", "inference/grpc_service.proto")
# Everything the generated files come from (grpc_service imports model_config).
ALL_PROTOS = (TYPED_API, *SERVICES, "inference/model_config.proto")
GENERATED = "attnserve/_generated"


def proto_root() -> Path:
    candidates = []
    if os.environ.get("ATTNSERVE_PROTO_DIR"):
        candidates.append(Path(os.environ["ATTNSERVE_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "proto"]
    for root in candidates:
        if all((root / name).is_file() for name in ALL_PROTOS):
            return root.resolve()
    raise SystemExit(
        "attnserve setup.py: cannot find the .proto files (%s) in any of: %s; "
        "set ATTNSERVE_PROTO_DIR to the repository's proto/ folder"
        % (", ".join(ALL_PROTOS), ", ".join(str(c) for c in candidates)))


def _protoc(args: list[str]) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    argv = ["grpc_tools.protoc", f"-I{proto_root()}", f"-I{well_known}", *args]
    if protoc.main(argv) != 0:
        raise SystemExit("attnserve setup.py: protoc failed: " + " ".join(argv))


def generate(out_dir: Path) -> dict[str, str]:
    """Writes the stubs into out_dir; returns the generator versions."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _protoc([f"--python_out={tmp}", f"--pyi_out={tmp}",
                 f"--grpc_python_out={tmp}", TYPED_API])
        _protoc([f"--descriptor_set_out={out_dir / 'services.binpb'}",
                 "--include_imports", *SERVICES])
        made = Path(tmp) / "attention" / "v1"
        for name in ("attention_pb2.py", "attention_pb2.pyi"):
            shutil.copyfile(made / name, out_dir / name)
        grpc_stub = (made / "attention_pb2_grpc.py").read_text()
        grpc_stub, count = re.subn(r"^from attention\.v1 import attention_pb2 as",
                                   "from . import attention_pb2 as", grpc_stub,
                                   flags=re.M)
        if count != 1:
            raise SystemExit("attnserve setup.py: unexpected grpc stub layout")
        (out_dir / "attention_pb2_grpc.py").write_text(grpc_stub)

    pb2 = (out_dir / "attention_pb2.py").read_text()
    match = re.search(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", pb2, re.M)
    if match:
        protobuf_version = ".".join(match.groups())
    else:  # gencode older than protobuf 4.24 names no version: use the build's
        import google.protobuf
        protobuf_version = google.protobuf.__version__
    match = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", grpc_stub, re.M)
    if match:
        grpc_version = match.group(1)
    else:
        from grpc_tools import grpc_version as tools_version
        grpc_version = tools_version.VERSION
    digest = hashlib.sha256()
    for name in ALL_PROTOS:
        digest.update((proto_root() / name).read_bytes())
    versions = {"grpc": grpc_version, "protobuf": protobuf_version,
                "proto_sha256": digest.hexdigest()}
    (out_dir / "__init__.py").write_text(
        '"""gRPC stubs generated from attnserve\'s .proto files when this package\n'
        'was built (setup.py); not in version control. Do not edit."""\n\n'
        f"GRPC_GENERATED_VERSION = {grpc_version!r}\n"
        f"PROTOBUF_GENCODE_VERSION = {protobuf_version!r}\n"
        f"PROTO_SHA256 = {versions['proto_sha256']!r}\n")
    return versions


_VERSIONS: dict[str, str] | None = None


def generator_versions() -> dict[str, str]:
    global _VERSIONS
    if _VERSIONS is None:
        with tempfile.TemporaryDirectory() as tmp:
            _VERSIONS = generate(Path(tmp))
    return _VERSIONS


def dependencies() -> list[str]:
    versions = generator_versions()
    protobuf_major = int(versions["protobuf"].split(".")[0])
    return [
        f"grpcio>={versions['grpc']},<2",
        f"protobuf>={versions['protobuf']},<{protobuf_major + 1}",
        "numpy>=1.23",
        "matplotlib>=3.6",
    ]


class BuildPyWithStubs(build_py):
    """build_py, then the generated stubs into the build (or, for an editable
    install, into src/, where the editable finder looks)."""

    def run(self) -> None:
        super().run()
        generate(self._generated_dir())

    def _generated_dir(self) -> Path:
        if getattr(self, "editable_mode", False):
            return HERE / "src" / GENERATED
        return Path(self.build_lib) / GENERATED

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        names = ("__init__.py", "attention_pb2.py", "attention_pb2.pyi",
                 "attention_pb2_grpc.py", "services.binpb")
        return super().get_outputs(include_bytecode) + [
            str(Path(self.build_lib) / GENERATED / name) for name in names]


class SdistWithProtos(sdist):
    """sdist, with the .proto files copied in (the archive's proto/)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for name in ALL_PROTOS:
            target = Path(base_dir) / "proto" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, target)


setup(
    install_requires=dependencies(),
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos},
)
