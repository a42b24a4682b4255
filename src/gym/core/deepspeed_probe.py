"""accelerate imports DeepSpeed to unwrap a model that DeepSpeed cannot have wrapped; here it asks only once it could.

accelerate's `extract_model_from_parallel`, behind the Trainer's construction, `unwrap_model` and every
`save_pretrained` of transformers, imports `deepspeed` wherever the package is installed, to test whether the model
is a `DeepSpeedEngine`. That import (with the `mlflow` client DeepSpeed's autotuner imports where the tracking extra
is installed) took ~1.25 s of a `gym train` process's start on a 2-core EPYC, in every run, DeepSpeed or not
(`bench/train_start.py`); a DeepSpeed run imports it anyway, before any model is wrapped.

An object can only be a `DeepSpeedEngine` once `deepspeed` has been imported, so accelerate's question "is
DeepSpeed available?" is answered, for that module only, "only if it is already imported": the unwrapping gives
the same model in every case, and a run that never touches DeepSpeed never imports it.

Installed when gym is imported, before anything imports accelerate; where accelerate came first, it is patched
at once. Python has no hook that runs after a module's import, so a finder on `sys.meta_path` wraps that one
module's loader.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

UNWRAPPING_MODULE = "accelerate.utils.other"


def deepspeed_if_imported(is_available: Callable[[], bool]) -> Callable[[], bool]:
    """`is_available`, answered False until `deepspeed` is in sys.modules (the original is its `__wrapped__`)."""
    if getattr(is_available, "_gym_imported_only", False):
        return is_available

    @functools.wraps(is_available)
    def available_and_imported() -> bool:
        return "deepspeed" in sys.modules and is_available()

    available_and_imported._gym_imported_only = True  # type: ignore[attr-defined]
    return available_and_imported


def _patch(module: ModuleType) -> None:
    module.is_deepspeed_available = deepspeed_if_imported(module.is_deepspeed_available)  # type: ignore[attr-defined]


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != UNWRAPPING_MODULE:
            return None
        spec = next((found for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     if (found := finder.find_spec(fullname, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # not found, or a loader of another kind: accelerate as it is
        run_module = spec.loader.exec_module

        def run_then_patch(module: ModuleType) -> None:
            run_module(module)
            _patch(module)

        spec.loader.exec_module = run_then_patch  # type: ignore[method-assign]
        return spec


def import_deepspeed_only_when_used() -> None:
    """Install the patch (once)."""
    if UNWRAPPING_MODULE in sys.modules:
        _patch(sys.modules[UNWRAPPING_MODULE])
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
