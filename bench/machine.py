"""The line every benchmark table starts with: which CPU measured it.

The project runs on more than one kind of CPU (AMD EPYC with AVX2, Intel
Xeon with AVX-512 and AMX) and their figures differ, so a table without its
CPU is not a result. Linux only (/proc/cpuinfo).
"""


def cpu_line():
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    vector = [name for name, flag in (("AVX2", "avx2"), ("FMA", "fma"),
                                      ("AVX-512", "avx512f"),
                                      ("AVX512-BF16", "avx512_bf16"),
                                      ("AMX", "amx_tile")) if flag in flags]
    return f"Measured on: {model} ({', '.join(vector) or 'no AVX2'})"
