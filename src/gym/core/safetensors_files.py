"""Opening the safetensors files users hand Gym (model folders, adapters, checkpoints) so that a damaged one is named.

safetensors checks a file's header, and that the header's tensors fit in the file, when it opens it, and reports a
truncated download or a half-copied file as "Error while deserializing header: ..." without saying which file: a
sharded model has several, and a run also reads adapters and checkpoints. The readers here turn that into one
ModelError naming the file. transformers' from_pretrained opens a model's files itself; its failure is named after
the fact by `first_damaged`, which reads headers only.

safetensors and torch are imported where a file is read, so that `import gym` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gym.core.errors import ModelError

PathLike = str | os.PathLike[str]


def damaged(path: PathLike, exc: BaseException) -> ModelError:
    """The error for a safetensors file that does not open: which file, and what to do about it."""
    lines = str(exc).strip().splitlines()
    detail = lines[0].removeprefix("Error while deserializing header: ") if lines else type(exc).__name__
    return ModelError(f"{path} is damaged or incomplete ({detail}): it is not a whole safetensors file. Re-download "
                      "or re-export it.")


@contextmanager
def open_safetensors(path: PathLike) -> Iterator[Any]:
    """safetensors' `safe_open(path, framework="pt")`, a damaged file a ModelError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="pt")
    except SafetensorError as exc:
        raise damaged(path, exc) from None
    with handle:
        yield handle


def load_safetensors(path: PathLike, device: str = "cpu") -> dict[str, Any]:
    """Every tensor of the file (safetensors.torch.load_file), a damaged file a ModelError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except SafetensorError as exc:
        raise damaged(path, exc) from None


def first_damaged(paths: Iterable[PathLike]) -> ModelError | None:
    """The error for the first of `paths` that does not open, else None. Only headers are read (a few KB a file), so
    it is cheap to ask after a library failed to load a folder without saying which of its files is at fault."""
    from safetensors import SafetensorError, safe_open

    for path in paths:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except SafetensorError as exc:
            return damaged(path, exc)
        except OSError:
            continue  # gone or unreadable: not what this names
    return None


def weight_files(folder: PathLike) -> list[Path]:
    """The safetensors files directly in `folder`, in name order (none when it is no folder)."""
    path = Path(folder)
    return sorted(path.glob("*.safetensors")) if path.is_dir() else []
