"""Models in, per-parameter deltas out: what a fine-tune changed, sorted by how it can be compressed.

A fine-tune is a full model folder (or hub id) or a LoRA adapter folder, which is merged onto the
base first. Deltas are taken over `named_parameters()`, so tied weights (SmolLM2's embedding is its
LM head) appear once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.models.adapters import BaseOption, attach_adapter
from gym.models.loader import load_causal_lm, require_safetensors, resolve_model_path
from gym.models.vision import is_multimodal

logger = logging.getLogger(__name__)

LINEAR, EMBEDDING, OTHER = "linear", "embedding", "other"


def merge_adapter(model: Any, folder: str | Path, base_ref: str | None, flag: BaseOption = "--base") -> Any:
    """`model` with the LoRA adapter at `folder` merged in; one line naming the tensor if it does not fit."""
    return attach_adapter(model, folder, base_ref, flag=flag)


def require_text_model(ref: str) -> str:
    """The model's resolved path; a ConfigError for a vision-language model, whose tower and projector a delta (a
    causal LM's weights, docs/deltas.md) cannot hold: transformers would fail on it as an unknown config class."""
    path = resolve_model_path(ref)
    if is_multimodal(path):
        raise ConfigError(f"{ref} is a vision-language model: deltas and per-user variants are built for text models "
                          "(a delta holds a causal LM's weights, not a vision tower or projector). Fine-tune it with "
                          "gym train and a LoRA adapter (docs/multimodal.md).")
    return path


def load_model(ref: str, base_ref: str | None = None) -> Any:
    """A causal LM in float32 on the CPU: a model reference, or a LoRA adapter folder merged onto `base_ref`."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        require_safetensors(folder)
    if (folder / "adapter_config.json").is_file():
        if base_ref is None:
            raise ConfigError(f"{folder} is a LoRA adapter: give the base it was trained on (--base).")
        model = merge_adapter(load_causal_lm(require_text_model(base_ref)), folder, base_ref)
    else:
        model = load_causal_lm(require_text_model(ref))
    # Where it came from (an adapter folder is otherwise forgotten once merged): gym.delta.calibration reads
    # the run's gym_config.yaml there.
    model.gym_source = str(folder) if folder.is_dir() else None
    return model.eval().requires_grad_(False)


def parameters(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def kind_of(name: str, tensor: torch.Tensor, model: Any) -> str:
    """linear: a 2-D weight inside the transformer blocks (attention and MLP projections); embedding:
    the input embedding or LM head; other: norms, biases and anything else."""
    embeddings = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        embeddings.add(id(model.get_output_embeddings().weight))
    parameter = dict(model.named_parameters())[name]
    if id(parameter) in embeddings:
        return EMBEDDING
    if tensor.ndim == 2 and ".layers." in name:
        return LINEAR
    return OTHER


@dataclass
class Delta:
    name: str
    kind: str
    value: torch.Tensor  # finetuned - base, float32


def extract_deltas(base: Any, finetuned: Any) -> list[Delta]:
    """Every parameter the fine-tune changed, as a float32 delta; unchanged ones are left out."""
    base_params, tuned_params = parameters(base), parameters(finetuned)
    if set(base_params) != set(tuned_params):
        only = sorted(set(base_params) ^ set(tuned_params))
        raise ConfigError(f"The fine-tune and the base have different parameters (e.g. {only[0]}): not the same "
                          "architecture, so there is no delta between them.")
    deltas = []
    for name, base_value in base_params.items():
        tuned = tuned_params[name]
        if tuned.shape != base_value.shape:
            raise ConfigError(f"Shape mismatch for {name}: base {tuple(base_value.shape)}, fine-tune "
                              f"{tuple(tuned.shape)}. Was the fine-tune made from this base?")
        if not torch.isfinite(tuned).all():
            raise ConfigError(f"The fine-tune's {name} contains NaN or Inf; refusing to compress a broken model.")
        if torch.equal(tuned, base_value):
            continue
        deltas.append(Delta(name, kind_of(name, base_value, base), tuned.float() - base_value.float()))
    if not deltas:
        raise ConfigError("The fine-tune is identical to the base: there is no delta to compress.")
    return deltas
