"""Packed int8/int4 weights kept on disk, so that the fast engine packs a model once, not at every start.

Packing searches 16 scales per block of 32 weights (gym.infer.fast.kernels): ~12 s of a 13 s start on the
embedded SmolLM2-135M on 2 cores, for the same answer every time. The packed tensors are written beside the
model (`<model>/.gym-packed/`), or under `$GYM_HOME/packed/` where the model's folder is not writable, as one
safetensors file per served format. Its name is a key of everything the packed bytes depend on: the model's
weight files (name, size, modification time: a changed file is a new key), the format, the block layout, the
packing code's own source and a version number, and torch's version (its rounding). A file is trusted only
whole: its checksum, its key and every entry's source shape, dtype and sampled values must match, else it
is ignored and written again. Writes go to a temporary name and are renamed into place, so a reader never
sees half a file, and two processes packing at once both end with a valid one.

GYM_PACK_CACHE=0 turns the cache off (the benchmark's baseline, bench/cold_start.py).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import stat
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gym.core.files import PACKED_FOLDER
from gym.core.home import gym_home
from gym.infer.fast import kernels
from gym.infer.fast.kernel_build import CSRC
from gym.infer.fast.linear import pack

logger = logging.getLogger(__name__)

# Bump when what a cache file holds changes in a way the packing functions' source does not show.
PACK_VERSION = 1
FOLDER = PACKED_FOLDER
# The values sampled from each source weight to check that it is the weight the entry was packed from: a
# strided handful costs microseconds and catches weights that differ from the files the key was made of.
SAMPLES = 4096

PACKED_DTYPES = ("int8", "int4")


def enabled() -> bool:
    return os.environ.get("GYM_PACK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def _code_version() -> str:
    """The packing code's identity: a change to any function that decides the packed bytes is a new key."""
    functions: list[Callable[..., Any]] = [kernels.pack_int8, kernels.pack_int4, kernels._best_scales,
                                           kernels._int4_codes, kernels._halving_sum, kernels._nibbles,
                                           kernels._grouped, kernels._grouped_params]
    layout = f"{PACK_VERSION}|{kernels.BLOCK}|{kernels.GROUP}|{kernels.QUAD}|{torch.__version__}"
    digest = hashlib.sha256(layout.encode())
    for function in functions:
        digest.update(inspect.getsource(function).encode())
    digest.update((CSRC / "pack.cpp").read_bytes())  # the compiled packer, which gives the same bytes
    return digest.hexdigest()


def weight_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


def cache_key(model_dir: Path, dtype: str) -> str:
    """What the packed bytes depend on. The weight files are known by name, size and modification time, not by
    content: hashing 0.5 GB would cost more than a warm start may take; replacing a file changes its mtime."""
    digest = hashlib.sha256(f"{dtype}|{_code_version()}".encode())
    for file in weight_files(model_dir):
        stat = file.stat()
        digest.update(f"|{file.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def cache_folders(model_dir: Path) -> list[Path]:
    """Where a model's packed weights may be, in the order they are tried: beside the model, then the model's
    own folder under $GYM_HOME/packed (named by its absolute path) for a model folder that is not writable."""
    name = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:16]
    return [model_dir / FOLDER, gym_home() / "packed" / name]


def _source(parts: list[torch.Tensor], dtype: str) -> dict[str, object]:
    """What an entry was packed from: the format, and each part's shape, dtype and sampled values (the parts
    are the module weights a product fuses, checked one by one so that a hit never has to fuse them)."""
    described = []
    for part in parts:
        flat = part.detach().reshape(-1)
        stride = max(1, flat.numel() // SAMPLES)
        sample = zlib.crc32(flat[::stride].contiguous().float().numpy().tobytes())
        described.append([list(part.shape), str(part.dtype), sample])
    return {"dtype": dtype, "parts": described}


def _checksum(tensors: dict[str, torch.Tensor]) -> int:
    crc = 0
    for name in sorted(tensors):
        crc = zlib.crc32(tensors[name].contiguous().view(torch.uint8).numpy().tobytes(), crc)
    return crc


class PackCache:
    """The packed weights of one model at one served format, by name. `lookup` returns an entry packed from the
    same parts (the module weights a product fuses), `pack` packs what the lookup missed and keeps it, `save()`
    writes the file when anything had to be packed. Not thread-safe: a decoder builds its weights in one go."""

    def __init__(self, model_dir: Path, dtype: str) -> None:
        self.model_dir = model_dir
        self.dtype = dtype
        self.key = cache_key(model_dir, dtype)
        self.file_name = f"{dtype}-{self.key}.safetensors"
        self.hits = 0
        self.packed = 0
        self._entries: dict[str, dict[str, object]] = {}
        self._tensors: dict[str, torch.Tensor] = {}
        self._loaded_from: Path | None = None
        self._opened = False  # the file is read on the first lookup: inside the engine's start, which times it

    @classmethod
    def for_model(cls, model_path: str | os.PathLike[str] | None, dtype: str) -> PackCache | None:
        """The cache for a model loaded as-is from a local folder of safetensors files; None where the weights
        are not what those files hold (no folder, no safetensors, or adapters merged in: the caller says so by
        not asking), for formats with nothing to pack, or when GYM_PACK_CACHE=0."""
        if dtype not in PACKED_DTYPES or model_path is None or not enabled():
            return None
        folder = Path(model_path)
        if not folder.is_dir() or not weight_files(folder):
            return None
        try:
            return cls(folder, dtype)
        except OSError as exc:  # a weight file vanished or is unreadable mid-stat: start without the cache
            logger.warning("Packed-weight cache unavailable for %s: %s", folder, exc)
            return None

    # -- reading -------------------------------------------------------------------------------------------
    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        for folder in cache_folders(self.model_dir):
            if self._load(folder / self.file_name):
                self._loaded_from = folder / self.file_name
                return

    def _load(self, path: Path) -> bool:
        if not path.is_file():
            return False
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not iterable)
            entries = json.loads(metadata["entries"])
            valid = (metadata.get("key") == self.key and int(metadata["checksum"]) == _checksum(tensors)
                     and all(f"{name}.weight" in tensors and f"{name}.scale" in tensors for name in entries))
        except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            logger.warning("Ignoring the packed-weight cache %s (%s): packing again.", path, exc)
            return False
        if not valid:
            logger.warning("Ignoring the packed-weight cache %s (it does not match its checksum or key): packing "
                           "again.", path)
            return False
        self._entries, self._tensors = entries, tensors
        return True

    def lookup(self, name: str, parts: list[torch.Tensor], dtype: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The packed weight and scales of `name` (the same name on every start) at `dtype`, if they were packed
        from these parts; else None."""
        self._open()
        if self._entries.get(name) != _source(parts, dtype):
            return None
        self.hits += 1
        return self._tensors[f"{name}.weight"], self._tensors[f"{name}.scale"]

    def pack(self, name: str, parts: list[torch.Tensor], weight: torch.Tensor,
             dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        """`weight` (the parts fused) packed as `dtype`, from the cache when it holds it."""
        cached = self.lookup(name, parts, dtype)
        if cached is not None:
            return cached
        source = _source(parts, dtype)
        packed, scale = pack(weight, dtype)
        self._entries[name] = source
        self._tensors[f"{name}.weight"], self._tensors[f"{name}.scale"] = packed, scale
        self.packed += 1
        return packed, scale

    # -- writing -------------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the cache when anything was packed this time: beside the model, else under $GYM_HOME. Returns
        where it went (None: nothing new, or no folder could take it; the engine runs either way)."""
        if not self.packed:
            return self._loaded_from
        for folder in cache_folders(self.model_dir):
            try:
                path = self._write(folder)
            except OSError as exc:
                logger.info("Cannot write packed weights to %s (%s).", folder, exc)
                continue
            logger.info("Packed weights cached in %s.", path)
            self.packed, self._loaded_from = 0, path
            return path
        logger.warning("The packed weights could not be cached; the next start packs them again.")
        return None

    def _write(self, folder: Path) -> Path:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.contiguous() for name, tensor in self._tensors.items()}
        metadata = {"key": self.key, "version": str(PACK_VERSION), "checksum": str(_checksum(tensors)),
                    "entries": json.dumps(self._entries, sort_keys=True)}
        handle, temporary = tempfile.mkstemp(prefix=f".{self.file_name}.", suffix=".tmp", dir=folder)
        os.close(handle)
        try:
            save_file(tensors, temporary, metadata=metadata)
            # mkstemp makes the file its owner's alone; the packed weights are the model's weights in another form,
            # so whoever may read the model may read them (else every other user of a shared model packs again).
            os.chmod(temporary, self._read_mode())
            os.replace(temporary, folder / self.file_name)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        for stale in folder.glob(f"{self.dtype}-*.safetensors"):  # older keys of this format: never read again
            if stale.name != self.file_name:
                stale.unlink(missing_ok=True)
        return folder / self.file_name

    def _read_mode(self) -> int:
        """The model's weight files' read permissions (the first file's), and always the owner's read and write."""
        files = weight_files(self.model_dir)
        shared = stat.S_IMODE(files[0].stat().st_mode) & 0o444 if files else 0
        return 0o600 | shared
