"""Builds the fast engine's CPU kernels into the package at install time (pyproject.toml holds the rest).

They are a torch C++ extension, so torch must be importable while building: `make` installs the pinned CPU
torch first and then Gym with `--no-build-isolation`. Where torch is missing, or the build fails (no
compiler), the package installs without them and Gym says so when it would use them (gym.infer.fast.kernels:
it then builds them at run time if a compiler is there, or runs their torch reference). GYM_SKIP_KERNELS=1
skips the build.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent


def kernel_extensions() -> tuple[list, dict]:
    if os.environ.get("GYM_SKIP_KERNELS") or platform.system() != "Linux":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("gym: torch is not importable in this build environment, so the fast engine's kernels are not "
              "prebuilt (install torch first and use pip install --no-build-isolation)", file=sys.stderr)
        return [], {}
    spec = importlib.util.spec_from_file_location("kernel_build", HERE / "src/gym/infer/fast/kernel_build.py")
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    sources = [str(path.relative_to(HERE)) for path in recipe.source_paths()]
    extension = CppExtension("gym.infer.fast._kernels", sources=sources,
                             extra_compile_args=[*recipe.COMPILE_FLAGS, recipe.hash_define()], optional=True)
    return [extension], {"build_ext": BuildExtension.with_options(use_ninja=True)}


extensions, commands = kernel_extensions()
setup(ext_modules=extensions, cmdclass=commands)
