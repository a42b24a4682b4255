"""The kernels' build: one library holding every instruction-set variant, built at install time.

- The library `pip install` built into the package loads without a compiler, from a copy of the package in a
  fresh virtual environment (what installing the wheel does), with no compiler, ninja or g++ on PATH.
- Its variants keep to their instruction sets: the disassembly shows no AVX instruction outside the AVX
  variants' own functions (so the portable path, and the headers' inline functions the linker shares between
  variants, run on any x86-64), and no AVX-512 register in the AVX2 variant's.
- A library built from other sources is recognised from its bytes and not loaded.
(Each variant's numbers against the reference: test_kernels.py, whose `ops` fixture forces each in turn.)
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gym.core.errors import ConfigError
from gym.infer.fast import kernel_build, kernels

PACKAGE = Path(kernels.__file__).resolve().parents[2]  # .../gym


def loaded_library() -> Path:
    status = kernels.kernel_status()
    if status is not None:
        pytest.skip(f"the kernels are not available here ({status})")
    prebuilt = kernels.prebuilt_library()
    if kernels.kernel_origin() == "prebuilt" and prebuilt is not None:
        return prebuilt
    from gym.core.home import gym_home

    return gym_home() / "kernels" / kernel_build.source_hash() / "gym_kernels.so"


def test_an_installed_package_loads_its_prebuilt_kernels_with_no_compiler_on_path(tmp_path):
    if kernels.prebuilt_library() is None or kernels.kernel_origin() != "prebuilt":
        pytest.skip("this checkout has no prebuilt kernels (installed without --no-build-isolation or torch)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    # the package as a wheel installs it (sources, csrc and the built library); its dependencies from here
    shutil.copytree(PACKAGE, target / "gym", ignore=shutil.ignore_patterns("__pycache__"))
    # PYTHONPATH's folders too, all but the checkout's own (make test-arm keeps the dependencies in one)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not (Path(p) / "gym").is_dir()]
    (target / "dependencies.pth").write_text("\n".join([*site.getsitepackages(), *extra]) + "\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    probe = ("import json, gym\nfrom gym.infer.fast import kernels\n"
             "print(json.dumps({'file': gym.__file__, 'status': kernels.kernel_status(), "
             "'origin': kernels.kernel_origin(), 'isa': kernels.kernel_isa()}))")
    env = {"PATH": str(empty), "HOME": str(tmp_path), "GYM_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    if "QEMU_LD_PREFIX" in os.environ:  # an aarch64 Python under qemu-user (make test-arm) finds its loader there
        env["QEMU_LD_PREFIX"] = os.environ["QEMU_LD_PREFIX"]
    done = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["file"].startswith(str(target))  # the copy, not this checkout
    assert report["status"] is None and report["origin"] == "prebuilt"
    assert report["isa"] == kernels.runnable_isas()[0]  # the best this CPU runs
    assert not (tmp_path / "home" / "kernels").exists()  # nothing was built


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the instruction-set variants are x86's")
def test_each_variant_keeps_to_its_instruction_set():
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    library = loaded_library()
    listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", str(library)], capture_output=True,
                             text=True, check=True, timeout=300).stdout
    function, used, broken = "", Counter(), Counter()
    evex_only = re.compile(r"%zmm|%[xy]mm(1[6-9]|2\d|3[01])\b|%k[1-7]\b")
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        parts = line.split("\t")
        if len(parts) < 2 or not function:
            continue
        instruction = parts[1]
        variant = "avx512" if "gym_isa_avx512" in function else "avx2" if "gym_isa_avx2" in function else "base"
        avx = instruction.startswith("v") or "%ymm" in instruction or "%zmm" in instruction
        used[variant] += avx
        if (variant == "base" and avx) or (variant == "avx2" and evex_only.search(instruction)):
            broken[function[:120]] += 1
    assert not broken, f"instructions beyond a function's variant: {broken.most_common(5)}"
    assert used["avx2"] > 100 and used["avx512"] > 100  # the variants are really vectorized for their sets


def test_a_library_of_other_sources_is_recognised_before_it_is_loaded(tmp_path):
    stale = tmp_path / "_kernels.so"
    stale.write_bytes(b"\x7fELF junk " + kernel_build.HASH_MARKER + b"hdeadbeef\0 more")
    assert kernel_build.built_hash(stale) == "hdeadbeef" != kernel_build.source_hash()
    assert kernel_build.built_hash(tmp_path / "missing.so") is None
    library = loaded_library()
    assert kernel_build.built_hash(library) == kernel_build.source_hash()


def test_a_variant_the_cpu_cannot_run_or_that_does_not_exist_is_one_line(monkeypatch):
    import torch

    if kernels.kernel_status() is not None:
        pytest.skip(f"the kernels are not available here ({kernels.kernel_status()})")
    with pytest.raises(RuntimeError, match="no such kernel variant"):
        torch.ops.gym_kernels.use_isa("sse9")
    monkeypatch.setenv("GYM_KERNEL_ISA", "sse9")
    with pytest.raises(ConfigError, match="GYM_KERNEL_ISA='sse9': choose one of auto, avx512_vnni"):
        kernels.requested_isa()
    monkeypatch.setenv("GYM_KERNEL_ISA", "avx3")
    with pytest.raises(ConfigError, match="Did you mean 'avx2'"):
        kernels.requested_isa()
    assert kernels.use_isa("auto") == kernels.runnable_isas()[0] == kernels.kernel_isa()
