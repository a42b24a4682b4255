"""Base + delta -> the fine-tuned model (exactly, for dense entries; as compressed, for the rest)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.core.files import (
    building_folder,
    check_free_space,
    make_folder,
    refuse_output_over_input,
    refuse_overwrite,
    write_manifest,
)
from gym.delta.compress import reconstruct
from gym.delta.format import fingerprint, load_delta
from gym.delta.tensor_quant import Encoded
from gym.delta.weights import load_model, parameters
from gym.models.loader import load_tokenizer, resolve_model_path


def check_base(base: Any, header: dict[str, Any], delta_path: str | os.PathLike[str],
               entries: dict[str, Encoded | torch.Tensor] | None = None) -> None:
    """Refuse a base the delta was not made from: first by what it changes (a parameter this base lacks, or has in
    another shape, names both shapes: a base of another size), then by the fingerprint (same shapes, other weights)."""
    made_from = header.get("base", {}).get("name") or "another model"
    params = dict(base.named_parameters())
    for name, entry in (entries or {}).items():
        if name not in params:
            raise ConfigError(f"{delta_path} changes {name}, which this base does not have: it was made from "
                              f"{made_from}. Apply it to that base.")
        shape = tuple(entry.shape)
        if shape != tuple(params[name].shape):
            raise ConfigError(f"{delta_path} does not fit this base: {name} is {'x'.join(map(str, shape))} in the "
                              f"delta and {'x'.join(map(str, params[name].shape))} in this base. It was made from "
                              f"{made_from}: apply it to that base.")
    if header.get("base", {}).get("fingerprint") != fingerprint(parameters(base)):
        raise ConfigError(f"{delta_path} was made from a different base model ({made_from}): its base fingerprint "
                          "does not match this base's tensors. Apply it to the base it was compressed from.")


def apply_delta(base: Any, entries: dict[str, Encoded | torch.Tensor], header: dict[str, Any],
                delta_path: str | os.PathLike[str] = "the delta") -> Any:
    """Add every entry to `base`'s parameters in place (after checking it is the right base); returns base."""
    check_base(base, header, delta_path, entries)
    params = dict(base.named_parameters())
    with torch.no_grad():
        for name, entry in entries.items():
            param = params[name]
            delta = reconstruct(entry) if isinstance(entry, Encoded) else entry
            # Dense deltas are added at their stored precision (float64 where needed) so that they are exact.
            precision = torch.promote_types(param.dtype, delta.dtype)
            param.copy_((param.to(precision) + delta.to(device=param.device, dtype=precision)).to(param.dtype))
    return base


def write_applied(base_ref: str, delta_path: str | os.PathLike[str], out: str | os.PathLike[str],
                  overwrite: bool = False) -> Path:
    """`gym delta apply`: a model folder (safetensors + tokenizer) that transformers loads as it is."""
    refuse_output_over_input(out, [base_ref, delta_path])
    refuse_overwrite(out, overwrite, folder=True)  # before minutes of work, not after
    entries, header = load_delta(delta_path)  # everything is checked before anything is written
    base_path = resolve_model_path(base_ref)
    model = apply_delta(load_model(base_ref), entries, header, delta_path)
    return save_model_folder(model, base_path, out, {"made_by": "gym delta apply", "base_model": base_ref,
                                                     "delta": str(delta_path), "delta_method": header.get("method")},
                             overwrite=overwrite)


def save_model_folder(model: Any, tokenizer: str | Any, out: str | os.PathLike[str],
                      manifest: dict[str, Any], overwrite: bool = False,
                      max_shard_size: int | str | None = None, how: str = "--overwrite") -> Path:
    """A model folder (weights, the tokenizer or the one at a path, gym_manifest.json) written under a temporary
    name and renamed into place, so a crash never leaves a half-written folder where a model was. An existing
    model there is replaced only with `overwrite`, and only if Gym wrote it (gym.core.files.refuse_overwrite).
    `max_shard_size`: safetensors shards of at most this size. `how`: the caller's spelling of `overwrite`."""
    out = Path(out)
    refuse_overwrite(out, overwrite, how, folder=True)
    make_folder(out.parent)
    check_free_space(out, sum(p.numel() * p.element_size() for p in model.parameters()))
    with building_folder(out, overwrite, how) as tmp:
        model.save_pretrained(tmp, **({"max_shard_size": max_shard_size} if max_shard_size is not None else {}))
        (load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer).save_pretrained(tmp)
        write_manifest(tmp, {"what": "model", **manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return out
