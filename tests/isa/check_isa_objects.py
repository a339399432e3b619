#!/usr/bin/env python3
"""Checks the per-instruction-set copies of the CPU kernels (lib/attn/internal/isa.h).

usage: check_isa_objects.py ISA OBJECT [OBJECT ...]
       check_isa_objects.py --program BINARY
(an OBJECT argument may hold several paths separated by ";", as CMake's
$<TARGET_OBJECTS:...> gives them)

--program: in a linked program, no function outside the non-baseline copies'
namespaces (attn::internal::avx2::, ::avx512::) contains an AVX instruction: the program
runs on any x86-64 CPU as long as it calls into a copy only where the CPU has
it (attn/cpu_isa.h decides that).

For the objects of one copy (ISA is "baseline", "avx2" or "avx512"):
- every symbol the objects define with external linkage is in namespace
  attn::internal::<ISA>, except inline functions of other libraries that the
  compiler emitted out of line (weak symbols, merged by the linker);
- no function outside that namespace contains a VEX/EVEX-encoded (AVX)
  instruction: the linker keeps one copy of each weak function for the whole
  program, and an AVX2 copy would crash a CPU without AVX2 in unrelated code;
- the baseline copy contains no AVX instruction at all, the avx2 copy does
  use 256-bit registers and the avx512 copy 512-bit ones (the target region
  took effect).
Exits 1 with the offending symbols listed, 0 otherwise.
"""
import re
import subprocess
import sys

# VEX/EVEX-encoded instructions are exactly the mnemonics that start with "v"
# among SSE/AVX ones; x86 has no legacy mnemonic starting with "v" but verr/verw.
AVX_MNEMONIC = re.compile(r"^v(?!err|erw)[a-z0-9]+$")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def in_namespace(name, namespace):
    """Whether the demangled function `name` is in `namespace`; objdump
    prints a template function's return type first ("void attn::...")."""
    return re.match(r"^(?:[\w*&]+ )*" + re.escape(namespace), name) is not None


def functions(obj):
    """Yields (demangled name, [mnemonics]) for every function in obj."""
    text = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", obj],
        check=True, capture_output=True, text=True).stdout
    name, mnemonics = None, []
    for line in text.splitlines():
        match = FUNCTION.match(line)
        if match:
            if name is not None:
                yield name, mnemonics
            name, mnemonics = match.group(1), []
            continue
        parts = line.split("\t")
        if name is not None and len(parts) >= 2 and parts[1].strip():
            mnemonics.append(parts[1].split()[0])
    if name is not None:
        yield name, mnemonics


def defined_symbols(obj):
    """Yields (type letter, demangled name) of the symbols obj defines."""
    text = subprocess.run(["nm", "-C", "--defined-only", obj], check=True,
                          capture_output=True, text=True).stdout
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            yield parts[1], parts[2]


# The namespaces of the copies compiled for more than baseline x86-64.
VECTOR_COPIES = ("attn::internal::avx2::", "attn::internal::avx512::")


def check_program(binary):
    errors = []
    functions_seen = 0
    for name, mnemonics in functions(binary):
        functions_seen += 1
        if any(in_namespace(name, copy) for copy in VECTOR_COPIES):
            continue
        avx = sorted({m for m in mnemonics if AVX_MNEMONIC.match(m)})
        if avx:
            errors.append(f"AVX instructions ({', '.join(avx[:5])}) in {name}")
    for error in errors:
        print(error)
    print(f"{binary}: {functions_seen} functions, {len(errors)} outside the "
          "vector copies with AVX instructions")
    sys.exit(1 if errors or functions_seen == 0 else 0)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--program":
        check_program(sys.argv[2])
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    isa = sys.argv[1]
    objects = [path for arg in sys.argv[2:] for path in arg.split(";") if path]
    namespace = f"attn::internal::{isa}::"
    errors = []
    # The widest register the copy's target region must have enabled.
    register = {"avx2": "%ymm", "avx512": "%zmm"}.get(isa)
    uses_register = False
    for obj in objects:
        for kind, name in defined_symbols(obj):
            if kind in "TDRB" and not name.startswith(namespace):
                errors.append(f"{obj}: global symbol outside {namespace}: {name}")
        for name, mnemonics in functions(obj):
            avx = sorted({m for m in mnemonics if AVX_MNEMONIC.match(m)})
            inside = in_namespace(name, namespace)
            if avx and (isa == "baseline" or not inside):
                errors.append(f"{obj}: AVX instructions ({', '.join(avx[:5])}) "
                              f"in {name}")
        if isa != "baseline":
            disassembly = subprocess.run(
                ["objdump", "-d", "--no-show-raw-insn", obj], check=True,
                capture_output=True, text=True).stdout
            uses_register = uses_register or register in disassembly
    if isa != "baseline" and not uses_register:
        errors.append(f"the {isa} copy never uses a {register} register: its "
                      "target region did not take effect")
    for error in errors:
        print(error)
    print(f"{isa}: {len(objects)} objects, {len(errors)} problems")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
