"""Any contribution -> a dense float32 delta against the soup's base, or a recorded reason to reject it.

A contribution is one of:
- a model object (anything with `named_parameters()`, e.g. a transformers model) of the base's architecture;
- a model folder (safetensors weights; a folder with only pickled `.bin` weights is refused);
- a LoRA adapter folder (`adapter_model.safetensors`), merged onto the base first;
- a Gym delta file (`gym delta compress`, BitDelta / DeltaQuant / dense), decoded; it must have been
  made from this base (fingerprint) and marked `enable_deltasoup` (the owner's opt-in to share it);
- a dict {parameter name: delta tensor}: the delta itself (finetuned - base).

Nothing is ever unpickled: model folders load through transformers from safetensors only, adapters through
peft from `adapter_model.safetensors`, delta files through safetensors.

Input that cannot be read at all (a path that does not exist, a pickle-only folder) raises ConfigError;
input that is readable but wrong for this soup (another base, other shapes, NaN) raises `Rejected`, which
the soup records in its ledger with the reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError, GymError, ModelError
from gym.core.files import MANIFEST_FILE
from gym.delta.compress import reconstruct
from gym.delta.format import fingerprint, load_delta, read_header
from gym.delta.weights import load_model, parameters
from gym.models.loader import require_safetensors


class Rejected(Exception):
    """A well-formed contribution this soup will not merge; str(exc) is the reason recorded."""


@dataclass
class Base:
    """The soup's base model, loaded once (float32, CPU) when first needed."""

    ref: str

    @cached_property
    def model(self) -> Any:
        return load_model(self.ref)

    @cached_property
    def params(self) -> dict[str, torch.Tensor]:
        return parameters(self.model)

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.params)


@dataclass
class Converted:
    delta: dict[str, torch.Tensor]  # only the parameters the contribution changed, float32
    source: str  # model | model_folder | lora_adapter | delta_file | delta_dict
    info: dict[str, Any] = field(default_factory=dict)


def to_delta(contribution: Any, base: Base) -> Converted:
    """The contribution as a float32 delta per changed parameter, structurally checked against `base`."""
    if isinstance(contribution, dict):
        return Converted(check_delta(contribution, base.params), "delta_dict")
    if hasattr(contribution, "named_parameters"):
        if hasattr(contribution, "merge_and_unload"):  # a PEFT model: its adapters folded in, on a copy
            import copy

            merged = copy.deepcopy(contribution).merge_and_unload()
            return Converted(_difference(dict(merged.named_parameters()), base.params), "peft_model")
        return Converted(_difference(dict(contribution.named_parameters()), base.params), "model")
    if isinstance(contribution, (str, os.PathLike)):
        return _from_path(Path(contribution).expanduser(), base)
    raise ConfigError(f"A contribution is a model, a model or LoRA adapter folder, a Gym delta file or a dict of "
                      f"delta tensors; got a {type(contribution).__name__}.")


def _from_path(path: Path, base: Base) -> Converted:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ConfigError(f"{path}: a contribution file must be a Gym delta (.safetensors from `gym delta "
                              "compress`); pickled files (.bin, .pt) are never loaded.")
        return _from_delta_file(path, base)
    if not path.is_dir():
        raise ConfigError(f"Contribution not found: {path}")
    require_safetensors(path)
    if (path / "adapter_config.json").is_file():
        return Converted(_difference(_load_params(str(path), base), base.params), "lora_adapter")
    if (path / "config.json").is_file():
        return Converted(_difference(_load_params(str(path), base), base.params), "model_folder")
    raise ConfigError(f"{path} is neither a model folder (config.json) nor a LoRA adapter (adapter_config.json).")


def _load_params(ref: str, base: Base) -> dict[str, torch.Tensor]:
    try:
        return parameters(load_model(ref, base.ref))
    except ConfigError as exc:  # the adapter does not fit the base: readable, but not for this soup
        raise Rejected(str(exc)) from None
    except ModelError as exc:  # its weights file is damaged, or NaN/inf (the base loaded: its fingerprint matched)
        raise Rejected(str(exc)) from None
    except GymError:
        raise
    except (ValueError, RuntimeError) as exc:  # transformers' size-mismatch errors for another architecture
        raise Rejected(f"the model does not load as this base's architecture: {exc}") from None


def _from_delta_file(path: Path, base: Base) -> Converted:
    header = read_header(path)  # not a Gym delta at all: ConfigError
    info = {"delta_method": header.get("method"),
            "deltasoup_eligible": bool(header.get("deltasoup", {}).get("eligible"))}
    made_from = header.get("base", {})
    if made_from.get("fingerprint") != base.fingerprint:
        raise Rejected(f"base fingerprint differs: the delta was made from {made_from.get('name') or 'another model'}, "
                       "not from this soup's base")
    if not info["deltasoup_eligible"]:
        raise Rejected("the delta file is not marked for DeltaSoup: its owner did not opt in "
                       "(compress it with --enable-deltasoup / enable_deltasoup=True)")
    try:
        entries, _ = load_delta(path)
    except ConfigError as exc:  # damaged or non-finite content
        raise Rejected(str(exc)) from None
    return Converted(check_delta({name: reconstruct(entry) for name, entry in entries.items()}, base.params),
                     "delta_file", info)


def _difference(tuned: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if set(tuned) != set(base):
        only = sorted(set(tuned) ^ set(base))
        raise Rejected(f"parameters differ from the base's (e.g. {only[0]}): not the same architecture")
    _check(tuned, base)
    return {name: d for name, value in tuned.items()
            if (d := value.detach().to("cpu", torch.float32) - base[name]).any()}


def check_delta(delta: dict[str, Any], base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A delta dict, checked (names, shapes, floating dtypes, finite) and made float32; all-zero entries dropped."""
    for name, value in delta.items():
        if not isinstance(value, torch.Tensor):
            raise Rejected(f"{name} is a {type(value).__name__}, not a tensor")
    unknown = sorted(set(delta) - set(base))
    if unknown:
        raise Rejected(f"changes {unknown[0]}, which the base does not have" +
                       (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    _check(delta, base)
    return {name: d for name, value in delta.items() if (d := value.detach().to("cpu", torch.float32)).any()}


def _check(tensors: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> None:
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(base[name].shape):
            raise Rejected(f"shape differs for {name}: {tuple(value.shape)}, the base's is {tuple(base[name].shape)}")
        if not value.is_floating_point():
            raise Rejected(f"dtype differs for {name}: {value.dtype}, the base's is {base[name].dtype} (a delta is "
                           "floating point)")
        if not torch.isfinite(value).all():
            raise Rejected(f"non-finite values (NaN or Inf) in {name}")


def l2_norm(delta: dict[str, torch.Tensor]) -> float:
    """The whole delta's L2 norm (accumulated in float64)."""
    return float(sum(float(t.double().pow(2).sum()) for t in delta.values()) ** 0.5)


def default_soup_path(base_model: str | os.PathLike[str]) -> Path:
    """$GYM_HOME/soups/<base name>: one soup per base on this machine."""
    from gym.core.home import gym_home

    name = Path(str(base_model).rstrip('/')).name or "base"
    return gym_home() / "soups" / "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def base_of(contribution: Any) -> str | None:
    """The base a contribution was fine-tuned from, where it says: a Gym run's manifest, a LoRA adapter's
    config, a PEFT model's config, a Gym delta file's header."""
    peft_config = getattr(contribution, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        base = getattr(next(iter(peft_config.values())), "base_model_name_or_path", None)
        if base:
            return str(base)
    ref = contribution if isinstance(contribution, (str, os.PathLike)) else (
        getattr(contribution, "gym_source", None) or getattr(contribution, "name_or_path", None))
    if not ref:
        return None
    path = Path(ref).expanduser()
    for name, key in ((MANIFEST_FILE, "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            value = json.loads((path / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError):
            continue
        if value:
            return str(value)
    if path.is_file() and path.suffix == ".safetensors":
        try:
            name = read_header(path).get("base", {}).get("name")
        except GymError:
            return None
        return str(name) if name else None
    return None
