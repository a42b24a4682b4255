"""The delta file: one `.safetensors` file, tensors plus a JSON header, no pickle anywhere.

Tensors are stored under `<parameter>::<part>` (e.g. `model.layers.0.mlp.up_proj.weight::codes`). The
header (safetensors metadata key `gym_delta`) says, per parameter, how it is encoded:

    {"format": "gym-delta", "version": 1, "method": "bitdelta", "options": {...},
     "base": {"fingerprint": "sha256...", "name": "smollm2-135m"},
     "entries": {"model.layers.0.mlp.up_proj.weight": {"encoding": "binary", "shape": [1536, 576],
                                                        "params": {"granularity": "tensor", ...}}, ...},
     "stats": {...}}

Encodings: the DeltaQuant methods (int8, int4, int2, ternary, binary; gym.delta.tensor_quant) and `dense`
(the delta itself, at the fine-tune's precision). The base fingerprint is computed from the base's
tensors, so a delta cannot be applied to a base it was not made from. Files are written to a
temporary name and renamed; reading checks everything before anything is used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gym.core.errors import ConfigError
from gym.core.files import check_free_space, readable_as_umask, refuse_overwrite, remove_stale_temps, temp_path
from gym.delta.tensor_quant import BITS, Encoded, QuantMethod

FORMAT = "gym-delta"
VERSION = 1
HEADER_KEY = "gym_delta"
DENSE = "dense"
_FINGERPRINT_SAMPLES = 4096


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, shape, dtype and 4,096 evenly spaced values.

    Sampled rather than whole so that a multi-gigabyte base is fingerprinted in moments; two different
    checkpoints of one architecture differ in practically every sampled value.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach()
        flat = tensor.reshape(-1)
        step = max(1, flat.numel() // _FINGERPRINT_SAMPLES)
        sample = flat[::step][:_FINGERPRINT_SAMPLES].to(torch.float32).cpu().contiguous()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


def _key(name: str, part: str) -> str:
    return f"{name}::{part}"


def save_delta(path: str | os.PathLike[str], entries: dict[str, Encoded | torch.Tensor],
               header: dict[str, Any], overwrite: bool = False) -> Path:
    """Write `entries` (an Encoded per quantized parameter, a tensor per dense one) with `header`: refused
    over an existing file unless `overwrite`, and before anything is written when the disk is too small."""
    tensors: dict[str, torch.Tensor] = {}
    described: dict[str, Any] = {}
    for name, entry in entries.items():
        if isinstance(entry, Encoded):
            described[name] = {"encoding": entry.method.value, "shape": list(entry.shape), "params": entry.params}
            tensors.update({_key(name, part): t.contiguous() for part, t in entry.tensors.items()})
        else:
            described[name] = {"encoding": DENSE, "shape": list(entry.shape)}
            tensors[_key(name, "delta")] = entry.detach().cpu().contiguous()
    full_header = {"format": FORMAT, "version": VERSION, **header, "entries": described}
    path = Path(path)
    refuse_overwrite(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    check_free_space(path, sum(t.numel() * t.element_size() for t in tensors.values()))
    tmp = temp_path(path)
    try:
        save_file(tensors, str(tmp), metadata={HEADER_KEY: json.dumps(full_header)})
        readable_as_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header alone (no tensor is read), checked for format and version."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; a delta is one file that `gym delta compress --base ... --finetuned "
                          f"{path} -o FILE.safetensors` writes.")
    if not path.is_file():
        raise ConfigError(f"Delta file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for truncated or foreign files
        raise ConfigError(f"{path} is not a readable delta file (truncated, or not safetensors): {exc}") from None
    if HEADER_KEY not in metadata:
        raise ConfigError(f"{path} is a safetensors file but not a Gym delta (no '{HEADER_KEY}' header); "
                          "make one with `gym delta compress`.")
    try:
        header = json.loads(metadata[HEADER_KEY])
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: the delta header is not valid JSON ({exc}).") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: the '{HEADER_KEY}' header is a JSON {type(header).__name__}, not an object; "
                          "the file is damaged or was not written by Gym.")
    if header.get("format") != FORMAT:
        raise ConfigError(f"{path}: unknown delta format {header.get('format')!r} (expected {FORMAT!r}).")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise ConfigError(f"{path}: delta format version {version!r} is not supported by this Gym (it reads up to "
                          f"version {VERSION}); upgrade Gym to read it.")
    _check_entries(path, header.get("entries"))
    return header


def _check_entries(path: str | os.PathLike[str], entries: Any) -> None:
    """Every entry of the header says how its parameter is stored, with a shape of non-negative integers."""
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: the delta header has no 'entries' object; the file is damaged.")
    for name, spec in entries.items():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ConfigError(f"{path}: the header entry of {name} has no valid shape; the file is damaged.")


def load_delta(path: str | os.PathLike[str]) -> tuple[dict[str, Encoded | torch.Tensor], dict[str, Any]]:
    """-> (entries as save_delta took them, header), after checking the file is whole and finite."""
    header = read_header(path)
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise ConfigError(f"{path} is not a readable delta file (truncated?): {exc}") from None
    entries: dict[str, Encoded | torch.Tensor] = {}
    for name, spec in header.get("entries", {}).items():
        parts = {key.split("::", 1)[1]: t for key, t in tensors.items() if key.split("::", 1)[0] == name}
        shape = tuple(spec.get("shape", ()))
        if spec.get("encoding") == DENSE:
            delta = parts.get("delta")
            if delta is None or tuple(delta.shape) != shape:
                raise ConfigError(f"{path}: the dense delta of {name} is missing or has the wrong shape.")
            entries[name] = delta
        else:
            try:
                method = QuantMethod(spec.get("encoding"))
            except ValueError:
                raise ConfigError(f"{path}: {name} has an unknown encoding {spec.get('encoding')!r}.") from None
            if "codes" not in parts or "scale" not in parts:
                raise ConfigError(f"{path}: {name} lacks its codes or scales; the file is damaged.")
            needed = -(-math.prod(shape) * BITS[method] // 8)  # bytes of packed codes the shape needs
            if parts["codes"].dtype != torch.uint8 or parts["codes"].numel() < needed:
                raise ConfigError(f"{path}: {name} has {parts['codes'].numel()} bytes of codes; its shape "
                                  f"{list(shape)} at {BITS[method]} bits needs {needed}. The file is damaged.")
            entries[name] = Encoded(method=method, shape=shape, tensors=parts, params=spec.get("params", {}))
        for part, tensor in parts.items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise ConfigError(f"{path}: {name}::{part} contains NaN or Inf; the delta is damaged.")
    return entries, header


def file_size(path: str | os.PathLike[str]) -> int:
    return Path(path).stat().st_size
