"""The optimizers Gym builds itself (BAdam, Adam-mini, Muon); GaLore, APOLLO and every `optim` name are the
Trainer's own (gym.config.optimizers translates the keys).

`install(trainer, args)` hands the trainer its optimizer before `train()`, so every Trainer-based method
(Gym's and TRL's) gets the same one, and the Trainer still builds the learning-rate schedule around it.
"""

from __future__ import annotations

import logging
from types import MethodType
from typing import Any

import torch

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean, split_names

logger = logging.getLogger(__name__)


class Chained(torch.optim.Optimizer):
    """Several optimizers stepping as one, for a Trainer that takes one. The parameter groups are the parts'
    own dicts, so the learning-rate schedule reaches every part."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts
        super().__init__([group for part in parts for group in part.param_groups], {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, state in zip(self.parts, state_dict["parts"]):
            part.load_state_dict(state)


def _decay_groups(named: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only, as the Trainer does (norms and biases are not decayed)."""
    decay = [p for n, p in named if p.ndim >= 2]
    rest = [p for n, p in named if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0})
            if g["params"]]


def muon(model: Any, args: TrainArgs[Any]) -> torch.optim.Optimizer:
    """Muon for the 2-D weights inside the transformer layers, AdamW for everything else; Muon's update is scaled
    to AdamW's RMS (`match_rms_adamw`), so one learning rate serves both."""
    training = args.training
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    is_hidden_matrix = [p.ndim == 2 and "embed" not in n and "lm_head" not in n and "score" not in n
                        for n, p in trainable]
    matrices = [p for (n, p), hidden in zip(trainable, is_hidden_matrix) if hidden]
    others = [(n, p) for (n, p), hidden in zip(trainable, is_hidden_matrix) if not hidden]
    parts: list[torch.optim.Optimizer] = [torch.optim.Muon(
        matrices, lr=training.learning_rate, weight_decay=training.weight_decay, adjust_lr_fn="match_rms_adamw")]
    if others:
        parts.append(torch.optim.AdamW(_decay_groups(others, training.weight_decay), lr=training.learning_rate,
                                       betas=(training.adam_beta1, training.adam_beta2), eps=training.adam_epsilon))
    return Chained(parts)


def adam_mini(model: Any, args: TrainArgs[Any]) -> torch.optim.Optimizer:
    """Adam-mini, told the attention shape so it can give each head its own second-moment value."""
    from adam_mini import Adam_mini

    config = model.config
    training = args.training
    return Adam_mini(
        named_parameters=model.named_parameters(), lr=training.learning_rate,
        betas=(training.adam_beta1, training.adam_beta2), eps=training.adam_epsilon,
        weight_decay=training.weight_decay, dim=config.hidden_size, n_heads=config.num_attention_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads, verbose=False,
    )


def badam(model: Any, args: TrainArgs[Any]) -> torch.optim.Optimizer:
    """BAdam: an AdamW that only ever holds state for the active block (a layer, or a share of every weight)."""
    from badam import BlockOptimizer, BlockOptimizerRatio

    options, training = args.finetuning, args.training
    named = list(model.named_parameters())
    if options.badam_mode == "layer":
        # BAdam indexes its list of blocks with start_block unchecked: an IndexError deep inside its constructor.
        blocks = len(BlockOptimizer.infer_param_groups(None, [name for name, _ in named], False, False))
        if options.badam_start_block is not None and not 0 <= options.badam_start_block < blocks:
            raise ConfigError(f"'badam_start_block' is a block index from 0 to {blocks - 1} (this model has {blocks} "
                              f"layers), got {options.badam_start_block}.")
        base = torch.optim.AdamW(_decay_groups(named, training.weight_decay), lr=training.learning_rate,
                                 betas=(training.adam_beta1, training.adam_beta2), eps=training.adam_epsilon)
        return BlockOptimizer(base_optimizer=base, named_parameters_list=named,
                              switch_block_every=options.badam_switch_interval,
                              start_block=options.badam_start_block, switch_mode=options.badam_switch_mode,
                              verbose=options.badam_verbose)
    return BlockOptimizerRatio(param_groups=_decay_groups(named, training.weight_decay), named_parameters_list=named,
                               update_ratio=options.badam_update_ratio, switch_every=options.badam_switch_interval,
                               mask_mode=options.badam_mask_mode, verbose=options.badam_verbose,
                               # BAdam freezes a separate LM head; a head tied to the embedding has none.
                               include_lm_head=not any("lm_head" in name for name, _ in named),
                               lr=training.learning_rate, betas=(training.adam_beta1, training.adam_beta2),
                               eps=training.adam_epsilon)


BUILDERS = {"use_muon": muon, "use_adam_mini": adam_mini, "use_badam": badam}


def build(model: Any, args: TrainArgs[Any]) -> torch.optim.Optimizer | None:
    """The optimizer the config's use_* key asks Gym to build, or None (the Trainer builds it from `optim`)."""
    chosen = [key for key in args.finetuning.chosen() if key in BUILDERS]
    if not chosen:
        return None
    optimizer = BUILDERS[chosen[0]](model, args)
    logger.info("Optimizer: %s (%s).", type(optimizer).__name__, chosen[0])
    return optimizer


def check_targets(model: Any, args: TrainArgs[Any]) -> None:
    """galore_target / apollo_target: each name must be a linear module of the model. The Trainer says only "No
    target modules found" (a ValueError traceback, when the first step builds the optimizer), or, for a typo beside
    a good name, projects the good one alone."""
    options = args.finetuning
    key = "galore_target" if options.use_galore else "apollo_target" if options.use_apollo else None
    if key is None or getattr(options, key) == "all":
        return
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    for target in split_names(getattr(options, key)):
        if not any(name == target or name.endswith(f".{target}") for name in linear):
            parts = {part for name in linear for part in name.split(".") if not part.isdigit()}
            hint = did_you_mean(target, parts, f" Linear modules here: {', '.join(sorted(parts))}.")
            raise ConfigError(f"'{key}': no linear module of the model is named '{target}'.{hint}")


def install(trainer: Any, args: TrainArgs[Any]) -> None:
    """Give a Trainer Gym's optimizer before it builds its own (it then builds only the schedule)."""
    if trainer.optimizer is not None:
        return
    check_targets(trainer.model, args)
    trainer.optimizer = build(trainer.model, args)
    if args.finetuning.use_badam:
        from badam import BAdamCallback, clip_grad_norm_old_version

        # BAdam's own hooks: gradient checkpointing that follows the active block, and (ratio mode) gradient
        # clipping that accepts the sparse gradients it produces, as BAdam's documentation prescribes.
        trainer.add_callback(BAdamCallback)
        if args.finetuning.badam_mode == "ratio":
            trainer.accelerator.clip_grad_norm_ = MethodType(clip_grad_norm_old_version, trainer.accelerator)
