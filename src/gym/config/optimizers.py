"""OptimizerArguments: memory-saving and alternative optimizers, with LLaMA-Factory's key names.

GaLore and APOLLO are Hugging Face optimizers (`optim: galore_adamw` ...): the keys here translate into `optim`,
`optim_target_modules` and `optim_args`, so the Trainer builds them. BAdam, Adam-mini and Muon are built by
Gym (gym.train.optimizers). Any other Hugging Face optimizer is the plain `optim` key, passed through.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gym.config.hf_training_fields import HFTrainingFields
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

if TYPE_CHECKING:
    from gym.config.args import TrainArgs

# use_<name> -> (package it imports, pip name)
PACKAGES = {
    "use_galore": ("galore_torch", "galore-torch"),
    "use_apollo": ("apollo_torch", "apollo-torch"),
    "use_badam": ("badam", "badam"),
    "use_adam_mini": ("adam_mini", "adam-mini"),
    "use_muon": ("torch", "torch>=2.9"),
}
# Optimizers that decide themselves which weights to project or update: all of the model's weights train.
FULL_ONLY = ("use_badam", "use_adam_mini")
# Hugging Face `optim` names whose optimizer lives in another package: (name prefix or name, module, pip name).
OPTIM_PACKAGES = [
    ("galore_", "galore_torch", "galore-torch"), ("apollo_", "apollo_torch", "apollo-torch"),
    ("adamw_torch_4bit", "torchao", "torchao"), ("adamw_torch_8bit", "torchao", "torchao"),
    ("adamw_torch_xla", "torch_xla", "torch-xla"), ("adamw_torch_npu_fused", "torch_npu", "torch-npu"),
    ("adamw_anyprecision", "torchdistx", "torchdistx"), ("lomo", "lomo_optim", "lomo-optim"),
    ("adalomo", "lomo_optim", "lomo-optim"), ("grokadamw", "grokadamw", "grokadamw"),
    ("schedule_free_", "schedulefree", "schedulefree"), ("stable_adamw", "optimi", "torch-optimi"),
    ("paged_", "bitsandbytes", "bitsandbytes"), ("lion_", "bitsandbytes", "bitsandbytes"),
    ("ademamix", "bitsandbytes", "bitsandbytes"), ("rmsprop_bnb", "bitsandbytes", "bitsandbytes"),
    ("adamw_bnb_8bit", "bitsandbytes", "bitsandbytes"), ("adamw_8bit", "bitsandbytes", "bitsandbytes"),
]
LOW_RANK = ("use_galore", "use_apollo")


@dataclass
class OptimizerArguments:
    """Alternative optimizers (GaLore, APOLLO, BAdam, Adam-mini, Muon)."""

    use_galore: bool = field(
        default=False, metadata={"help": "GaLore: Adam on low-rank projections of the gradients of full weights "
                                 "(finetuning_type full/freeze; Hugging Face's galore_adamw)."})
    galore_target: str = field(
        default="all", metadata={"help": "GaLore: comma-separated linear module names, or 'all'."})
    galore_rank: int = field(default=16, metadata={"help": "GaLore: rank of the gradient projection."})
    galore_update_interval: int = field(
        default=200, metadata={"help": "GaLore: steps between recomputing the projection (SVD of the gradient)."})
    galore_scale: float = field(default=2.0, metadata={"help": "GaLore: scale of the projected update."})
    galore_proj_type: Literal["std", "reverse_std", "right", "left", "full"] = field(
        default="std", metadata={"help": "GaLore: which side(s) the gradient is projected on."})
    galore_layerwise: bool = field(
        default=False, metadata={"help": "GaLore: step each weight's optimizer in the backward pass, freeing its "
                                 "gradient at once (saves memory; no gradient accumulation)."})
    use_apollo: bool = field(
        default=False, metadata={"help": "APOLLO: SGD-like memory with AdamW-like updates through random "
                                 "projections (finetuning_type full/freeze; Hugging Face's apollo_adamw)."})
    apollo_target: str = field(
        default="all", metadata={"help": "APOLLO: comma-separated linear module names, or 'all'."})
    apollo_layerwise: bool = field(
        default=False, metadata={"help": "APOLLO: step each weight's optimizer in the backward pass (as "
                                 "galore_layerwise)."})
    apollo_rank: int = field(default=16, metadata={"help": "APOLLO: rank of the projection."})
    apollo_update_interval: int = field(default=200, metadata={"help": "APOLLO: steps between new projections."})
    apollo_scale: float = field(default=32.0, metadata={"help": "APOLLO: scale of the update."})
    apollo_proj: Literal["svd", "random"] = field(default="random", metadata={"help": "APOLLO: projection kind."})
    apollo_scale_type: Literal["channel", "tensor"] = field(
        default="channel", metadata={"help": "APOLLO: one scale per channel or per tensor (APOLLO-Mini)."})
    use_badam: bool = field(
        default=False, metadata={"help": "BAdam: Adam on one block of the model at a time (finetuning_type full)."})
    badam_mode: Literal["layer", "ratio"] = field(
        default="layer", metadata={"help": "BAdam: update whole layers in turn (layer) or a random share of each "
                                   "weight (ratio)."})
    badam_start_block: int | None = field(default=None, metadata={"help": "BAdam layer mode: the first block."})
    badam_switch_mode: Literal["ascending", "descending", "random", "fixed"] = field(
        default="ascending", metadata={"help": "BAdam layer mode: the order blocks are visited in."})
    badam_switch_interval: int = field(
        default=50, metadata={"help": "BAdam: steps before moving to the next block (ratio mode: a new mask)."})
    badam_update_ratio: float = field(
        default=0.05, metadata={"help": "BAdam ratio mode: share of each weight updated."})
    badam_mask_mode: Literal["adjacent", "scatter"] = field(
        default="adjacent", metadata={"help": "BAdam ratio mode: updated entries adjacent or scattered."})
    badam_verbose: int = field(default=0, metadata={"help": "BAdam: 0 quiet, 1 block switches, 2 every step."})
    use_adam_mini: bool = field(
        default=False, metadata={"help": "Adam-mini: one second-moment value per block of a weight instead of per "
                                 "entry (about half of Adam's memory; finetuning_type full)."})
    use_muon: bool = field(
        default=False, metadata={"help": "Muon (torch.optim.Muon) for the 2-D weights inside the layers (LoRA "
                                 "matrices included), AdamW for embeddings, head, norms and biases."})

    def chosen(self) -> list[str]:
        return [key for key in PACKAGES if getattr(self, key)]

    def validate(self, args: TrainArgs[Any]) -> None:
        chosen = self.chosen()
        self._no_options_of_others(chosen)
        if not chosen:
            return
        if len(chosen) > 1:
            raise ConfigError(f"'{chosen[0]}' and '{chosen[1]}' both choose the optimizer; keep one.")
        key = chosen[0]
        finetuning_type = args.finetuning.finetuning_type
        if key in FULL_ONLY and finetuning_type != "full":
            raise ConfigError(f"'{key}' updates the model's own weights: it needs finetuning_type: full "
                              f"(got {finetuning_type}).")
        if key in LOW_RANK and finetuning_type not in ("full", "freeze"):
            raise ConfigError(f"'{key}' projects the gradients of full weights; with finetuning_type: "
                              f"{finetuning_type} use finetuning_type: full or freeze (LoRA is low-rank already).")
        layerwise = {"use_galore": "galore_layerwise", "use_apollo": "apollo_layerwise"}.get(key)
        if layerwise and getattr(self, layerwise) and args.training.gradient_accumulation_steps > 1:
            raise ConfigError(f"'{layerwise}' steps each weight during the backward pass, so it cannot "
                              "accumulate gradients: set gradient_accumulation_steps: 1.")
        if key == "use_badam" and _zero_stage(args.training.deepspeed) == 3:
            raise ConfigError("'use_badam' cannot run under DeepSpeed ZeRO-3 (the active block's parameters are "
                              "sharded away); use ZeRO stage 0-2 or no DeepSpeed.")
        # Sizes the optimizers take without a word and then update nothing (rank 0) or fail inside the first step.
        sizes = {"use_galore": ("galore_rank", "galore_update_interval"),
                 "use_apollo": ("apollo_rank", "apollo_update_interval"),
                 "use_badam": ("badam_switch_interval",)}.get(key, ())
        for size in sizes:
            if getattr(self, size) < 1:
                raise ConfigError(f"'{size}' must be at least 1, got {getattr(self, size)}.")
        if self.badam_update_ratio <= 0 or self.badam_update_ratio > 1:
            raise ConfigError(f"'badam_update_ratio' must be in (0, 1], got {self.badam_update_ratio}.")
        package, pip_name = PACKAGES[key]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"'{key}' needs the {package} package, which is not installed: pip install {pip_name} "
                              "(or pip install 'zoo-gym[optimizers]').")

    def _no_options_of_others(self, chosen: list[str]) -> None:
        """An option of an optimizer the run does not use (galore_rank without use_galore; galore_target with
        use_apollo, whose own is apollo_target) was read by nothing."""
        for f in dataclasses.fields(OptimizerArguments):
            prefix = f.name.split("_")[0]
            if prefix in ("galore", "apollo", "badam") and f"use_{prefix}" not in chosen \
                    and getattr(self, f.name) != f.default:
                active = [key.removeprefix("use_") for key in chosen]
                own = f" ({active[0]}'s own keys are {active[0]}_*)" if active and active[0] != "muon" else ""
                raise ConfigError(f"'{f.name}' tunes use_{prefix}, which this run does not use{own}: set "
                                  f"use_{prefix}: true or remove it.")

    def check_environment(self, args: TrainArgs[Any]) -> None:
        if self.use_muon:
            import torch

            if not hasattr(torch.optim, "Muon"):
                raise ConfigError(f"'use_muon' needs torch.optim.Muon (torch >= 2.9); this is {torch.__version__}.")

    def hf_optimizer(self) -> dict[str, Any]:
        """The Hugging Face training keys GaLore/APOLLO translate into ({} for the others)."""
        if self.use_galore:
            options = (f"rank={self.galore_rank},update_proj_gap={self.galore_update_interval},"
                       f"scale={self.galore_scale},proj_type={self.galore_proj_type}")
            return {"optim": "galore_adamw" + ("_layerwise" if self.galore_layerwise else ""),
                    "optim_target_modules": _targets(self.galore_target), "optim_args": options}
        if self.use_apollo:
            options = (f"rank={self.apollo_rank},update_proj_gap={self.apollo_update_interval},"
                       f"scale={self.apollo_scale},proj={self.apollo_proj},scale_type={self.apollo_scale_type}")
            return {"optim": "apollo_adamw" + ("_layerwise" if self.apollo_layerwise else ""),
                    "optim_target_modules": _targets(self.apollo_target), "optim_args": options}
        return {}


def _targets(names: str) -> str:
    """'all' or comma-separated module names -> the Trainer's optim_target_modules (a string is a regex to it,
    matched against whole module names)."""
    if names == "all":
        return "all-linear"
    escaped = [re.escape(name.strip()) for name in names.split(",") if name.strip()]
    return rf".*\.({'|'.join(escaped)})"


def check_optim(name: str) -> None:
    """An `optim` name the Trainer knows, whose package is installed (else the error names the closest name,
    or the package), checked before anything loads rather than when the Trainer builds the optimizer."""
    names = optimizer_names()
    if name not in names:
        raise ConfigError(f"'optim: {name}' is not a Hugging Face optimizer.{did_you_mean(name, names)} "
                          f"Available: {', '.join(names)}.")
    for prefix, module, pip_name in OPTIM_PACKAGES:
        if name.startswith(prefix) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"'optim: {name}' needs the {module} package, which is not installed: "
                              f"pip install {pip_name}.")


def optimizer_names() -> list[str]:
    """The `optim` values Hugging Face's Trainer knows (its OptimizerNames, from gym.config.hf_training_fields)."""
    hint = typing.get_type_hints(HFTrainingFields)["optim"]
    return [str(name) for name in typing.get_args(hint)]


def _zero_stage(deepspeed: Any) -> int | None:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file path), if one is given and readable."""
    if isinstance(deepspeed, str) and Path(deepspeed).is_file():
        try:
            deepspeed = json.loads(Path(deepspeed).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
    if isinstance(deepspeed, dict):
        stage = deepspeed.get("zero_optimization", {}).get("stage")
        return int(stage) if isinstance(stage, int) else None
    return None
