"""The models a merge reads, each as a source of per-parameter tensors, checked against the base first.

- A full fine-tune is read lazily from its safetensors files, one tensor at a time, so a merge holds the base
  plus one tensor per model in memory rather than every model (as mergekit does). Its tensor names and shapes
  must be the base's; the first that differs is named.
- A LoRA adapter is folded into a copy of the base with peft (merge_and_unload, so LoRA, DoRA, rsLoRA and
  modules_to_save all fold as peft defines them) and kept as the deltas of the parameters it changed.
  An adapter that records another base than base_model (in adapter_config.json or Gym's manifest) is refused.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from safetensors import safe_open

from gym.core.errors import ConfigError
from gym.core.files import MANIFEST_FILE
from gym.merge.config import same_model
from gym.models.adapters import check_adapter_weights, load_peft_adapter
from gym.models.loader import require_safetensors, resolve_model_path
from gym.models.registry import EMBEDDED, HUB_PRESETS


def is_adapter(ref: str) -> bool:
    return (Path(ref).expanduser() / "adapter_config.json").is_file()


def adapter_config(ref: str) -> dict[str, Any]:
    path = Path(ref).expanduser() / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} could not be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object.")
    return config


class Unchanged:
    """The model the merge started from (the first model of a linear merge without base_model)."""

    def weight(self, name: str, base: torch.Tensor) -> torch.Tensor | None:
        return None


class FullModel:
    """A full fine-tune's safetensors files, read one tensor at a time."""

    def __init__(self, ref: str, expected: dict[str, torch.Size], aliases: set[str], base_label: str) -> None:
        self.ref = ref
        folder = _local_folder(ref)
        files = sorted(folder.glob("*.safetensors"))
        self.handles: dict[str, Any] = {}  # tensor name -> the open (memory-mapped) file holding it
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            handle = safe_open(str(file), framework="pt")
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                self.handles[key] = handle
                shapes[key] = tuple(handle.get_slice(key).get_shape())
        missing = [name for name in expected if name not in shapes]
        if missing:
            raise ConfigError(f"{ref} has no tensor {missing[0]}, which {base_label} has: not a fine-tune of it "
                              "(a different architecture or size).")
        extra = [name for name in shapes if name not in expected and name not in aliases]
        if extra:
            raise ConfigError(f"{ref} has a tensor {extra[0]} that {base_label} does not: not a fine-tune of it.")
        for name, shape in expected.items():
            if shapes[name] != tuple(shape):
                raise ConfigError(f"{ref}: {name} has shape {shapes[name]}, {base_label}'s is {tuple(shape)}; "
                                  "not a fine-tune of it.")

    def weight(self, name: str, base: torch.Tensor) -> torch.Tensor | None:
        return self.handles[name].get_tensor(name).to(torch.float32)


class FoldedAdapter:
    """A LoRA adapter as the deltas it adds to the base once merged."""

    def __init__(self, ref: str, base: Any) -> None:
        self.ref = ref
        require_safetensors(Path(ref).expanduser())
        try:
            merged = load_peft_adapter(copy.deepcopy(base), Path(ref).expanduser()).merge_and_unload()
        except (ValueError, RuntimeError, KeyError) as exc:
            raise ConfigError(f"The LoRA adapter {ref} does not fit the base: {loading_error(exc)}") from None
        before = dict(base.named_parameters())
        self.deltas = {name: (param.detach() - before[name].detach())
                       for name, param in merged.named_parameters() if not torch.equal(param, before[name])}

    def weight(self, name: str, base: torch.Tensor) -> torch.Tensor | None:
        delta = self.deltas.get(name)
        return None if delta is None else base + delta


def check_adapter_base(ref: str, base_ref: str, base_path: str) -> None:
    """Refuse an adapter that records a base other than base_model (an adapter that records none is let through:
    its shapes are still checked when it is folded)."""
    recorded = [str(adapter_config(ref).get("base_model_name_or_path") or "")]
    try:
        manifest = json.loads((Path(ref).expanduser() / MANIFEST_FILE).read_text(encoding="utf-8"))
        recorded += [str(manifest.get("base_model") or ""), str(manifest.get("resolved_base_path") or "")]
    except (OSError, ValueError, AttributeError):
        pass  # not a Gym run: adapter_config.json is all there is
    recorded = [r for r in recorded if r]
    ours = [base_ref, base_path, *([EMBEDDED[base_ref].hub_id] if base_ref in EMBEDDED else []),
            *([HUB_PRESETS[base_ref]] if base_ref in HUB_PRESETS else [])]
    if recorded and not any(same_model(r, b) for r in recorded for b in ours):
        raise ConfigError(f"The LoRA adapter {ref} was trained on {recorded[0]}, not on base_model {base_ref}: "
                          f"a LoRA applies only to its own base. Set base_model: {recorded[0]} (and merge only "
                          "adapters of that base).")
    check_adapter_weights(ref)  # else NaN in it reads as a merge that "gives NaN", and a damaged file goes unnamed


def open_source(ref: str, skeleton: Any, base_label: str) -> FullModel | FoldedAdapter:
    if is_adapter(ref):
        return FoldedAdapter(ref, skeleton)
    expected = {name: p.shape for name, p in skeleton.named_parameters()}
    return FullModel(ref, expected, set(skeleton.state_dict()), base_label)


def _local_folder(ref: str) -> Path:
    """The folder holding a model's safetensors files: a local folder, or a hub model's cached snapshot."""
    resolved = resolve_model_path(ref)
    folder = Path(resolved)
    if not folder.is_dir():
        folder = Path(snapshot_download(resolved, allow_patterns=["*.safetensors", "*.json"]))
    require_safetensors(folder)
    return folder


def loading_error(exc: BaseException) -> str:
    """The line of a peft/torch loading error that names the tensor (size mismatch, missing key)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "mismatch" in line or "Missing" in line or "not found" in line]
    return (named or lines or [type(exc).__name__])[0]
