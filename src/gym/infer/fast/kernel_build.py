"""How the decode kernels are built: one recipe for `pip install` (setup.py builds them as a torch C++
extension) and for a build at run time (kernels.py, where no prebuilt library matches the sources).

One library holds every instruction-set variant (csrc/isa_*.cpp: portable, AVX2, AVX-512, AVX-512 VNNI) and
picks one when it loads (csrc/dispatch.cpp), so a single build runs on any x86-64 CPU and takes its best
path. No -march flag is given: each variant's instruction set is a target pragma inside linear.cpp.

This module imports nothing beyond the standard library: setup.py loads it by path, before Gym's
dependencies are installed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
# Link order matters: where two objects define the same inline function (a header's), the linker keeps the
# first, so the portable objects come first (the headers are compiled for the baseline in every variant, see
# linear.cpp; this keeps it safe even where a compiler instantiated one under a variant's target).
SOURCES = ("dispatch.cpp", "isa_portable.cpp", "isa_avx2.cpp", "isa_avx512.cpp", "isa_avx512_vnni.cpp")
HEADERS = ("linear.cpp", "pack.cpp", "sampling.cpp", "ops.h")
# -ffp-contract=off: whether the compiler fuses a scalar multiply-add must not differ between two loops that
# promise the same numbers (batch invariance, see kernels.py).
COMPILE_FLAGS = ("-O3", "-g0", "-ffp-contract=off", "-fvisibility=hidden")  # -g0: setuptools adds -g
VARIANTS = ("avx512_vnni", "avx512", "avx2", "portable")  # best first, as dispatch.cpp orders them
HASH_MARKER = b"GYM_KERNEL_SOURCE_HASH="


def source_paths() -> list[Path]:
    return [CSRC / name for name in SOURCES]


def source_hash() -> str:
    """A digest of every source and flag: a library built from other sources is not loaded as this one."""
    digest = hashlib.sha256(" ".join(COMPILE_FLAGS).encode())
    for name in sorted(SOURCES + HEADERS):
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    return "h" + digest.hexdigest()[:20]  # a C identifier: the flag passes it unquoted


def hash_define(value: str | None = None) -> str:
    """The compiler flag that records the sources' digest in the library (read back by built_hash): a bare
    token, stringized in dispatch.cpp, because quotes do not survive both ninja's shell and setuptools' argv."""
    return f"-DGYM_KERNEL_SOURCE_HASH={value or source_hash()}"


def built_hash(library: Path) -> str | None:
    """The digest a built library records, read from its bytes without loading it (loading registers its
    operators for the process's life, so a stale library must be recognised before)."""
    try:
        data = library.read_bytes()
    except OSError:
        return None
    at = data.find(HASH_MARKER)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(HASH_MARKER):end].decode("ascii", "replace")
