"""Optimizers: each use_* key (and `optim`) builds the optimizer it names, moves the parameters it should and
leaves the rest; impossible combinations are config errors before anything loads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from gym.config.optimizers import OptimizerArguments
from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.train import workflow


def _run(train_config, capture_trainer, **keys):
    from gym.workflows.training import run_exp

    seen = capture_trainer(workflow)
    result = run_exp(train_config(finetuning_type="full", learning_rate=1e-3, max_steps=3, **keys))
    optimizer = seen["trainer"].optimizer
    return getattr(optimizer, "optimizer", optimizer), Path(result.output_dir)  # accelerate wraps it


def _changed(tiny_model_dir: Path, out: Path) -> dict[str, float]:
    """Parameter name -> share of its entries the run changed."""
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    trained = load_file(str(out / "model.safetensors"))
    return {k: (base[k] != trained[k]).float().mean().item() for k in base}


@pytest.mark.parametrize(("keys", "optimizer_name"), [
    ({"use_galore": True, "galore_rank": 4, "galore_update_interval": 2}, "galore_torch.adamw.AdamW"),
    ({"use_galore": True, "galore_layerwise": True}, "trainer_pt_utils.LayerWiseDummyOptimizer"),
    ({"use_apollo": True, "apollo_rank": 4}, "apollo_torch.apollo.AdamW"),
    ({"use_adam_mini": True}, "adam_mini.adam_mini.Adam_mini"),
    ({"optim": "adafactor"}, "transformers.optimization.Adafactor"),
    ({"optim": "sgd"}, "torch.optim.sgd.SGD"),
    ({"optim": "lion_8bit"}, "bitsandbytes.optim.lion.Lion"),
])
def test_the_optimizer_asked_for_moves_every_weight(train_config, capture_trainer, tiny_model_dir, keys,
                                                    optimizer_name):
    optimizer, out = _run(train_config, capture_trainer, **keys)
    assert f"{type(optimizer).__module__}.{type(optimizer).__name__}".endswith(optimizer_name)
    changed = _changed(tiny_model_dir, out)
    assert all(share > 0 for share in changed.values()), [k for k, v in changed.items() if v == 0]


def test_galore_projects_only_its_targets(train_config, capture_trainer):
    optimizer, _ = _run(train_config, capture_trainer, use_galore=True, galore_target="q_proj,v_proj",
                        galore_rank=4)
    projected = [g for g in optimizer.param_groups if "rank" in g]
    assert len(projected) == 1 and projected[0]["rank"] == 4
    assert len(projected[0]["params"]) == 4  # q_proj and v_proj of 2 layers
    assert all(p.shape == (64, 64) or p.shape == (32, 64) for p in projected[0]["params"])


@pytest.mark.parametrize(("keys", "message"), [
    ({"use_galore": True, "galore_target": "q_proj,v_prj"}, "'galore_target': no linear module of the model is named "
                                                            "'v_prj'. Did you mean 'v_proj'"),
    ({"use_apollo": True, "apollo_target": "q_prj"}, "'apollo_target': .* 'q_prj'. Did you mean 'q_proj'"),
    ({"use_badam": True, "badam_start_block": 2}, r"'badam_start_block' is a block index from 0 to 1 \(this model "
                                                  r"has 2 layers\), got 2"),
])
def test_optimizer_settings_the_model_does_not_have_are_config_errors(train_config, keys, message):
    """They failed at the first step: the Trainer's ValueError "No target modules found" (and a typo beside a good
    name projected the good one alone), BAdam's IndexError."""
    from gym.workflows.training import run_exp

    with pytest.raises(ConfigError, match=message):
        run_exp(train_config(finetuning_type="full", max_steps=1, **keys))


def test_badam_layer_mode_updates_one_block(train_config, capture_trainer, tiny_model_dir):
    optimizer, out = _run(train_config, capture_trainer, use_badam=True, badam_switch_mode="ascending",
                          badam_switch_interval=100)
    assert type(optimizer).__name__ == "BlockOptimizer"
    changed = _changed(tiny_model_dir, out)
    assert all(changed[k] > 0 for k in changed if k.startswith("model.layers.0."))
    assert all(changed[k] == 0 for k in changed if not k.startswith("model.layers.0."))  # layer 1, embeddings


def test_badam_ratio_mode_updates_a_share_of_each_weight(train_config, capture_trainer, tiny_model_dir):
    optimizer, out = _run(train_config, capture_trainer, use_badam=True, badam_mode="ratio", badam_update_ratio=0.1)
    assert type(optimizer).__name__ == "BlockOptimizerRatio"
    changed = _changed(tiny_model_dir, out)
    matrices = {k: v for k, v in changed.items() if "layers." in k and k.endswith("proj.weight")}
    assert all(0 < share <= 0.2 for share in matrices.values()), matrices


@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(train_config, capture_trainer, tiny_model_dir,
                                                           finetuning_type):
    from gym.workflows.training import run_exp

    seen = capture_trainer(workflow)
    run_exp(train_config(finetuning_type=finetuning_type, use_muon=True, max_steps=2))
    trainer = seen["trainer"]
    chained = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    muon, *rest = chained.parts
    assert isinstance(muon, torch.optim.Muon)
    muon_names = [names[id(p)] for g in muon.param_groups for p in g["params"]]
    assert muon_names and all(".layers." in n and "norm" not in n for n in muon_names)
    if finetuning_type == "lora":
        assert all("lora_" in n for n in muon_names) and not rest  # LoRA trains matrices only
    else:
        adamw_names = {names[id(p)] for g in rest[0].param_groups for p in g["params"]}
        assert "model.embed_tokens.weight" in adamw_names and any("norm" in n for n in adamw_names)
    # The learning-rate schedule reaches both parts through the shared parameter groups.
    assert all(g["lr"] != trainer.args.learning_rate for g in chained.param_groups)  # decayed by the schedule


@pytest.mark.parametrize(("keys", "message"), [
    ({"use_badam": True}, "needs finetuning_type: full"),
    ({"use_adam_mini": True, "finetuning_type": "freeze"}, "needs finetuning_type: full"),
    ({"use_galore": True}, "use finetuning_type: full or freeze"),
    ({"use_galore": True, "use_muon": True, "finetuning_type": "full"}, "both choose the optimizer"),
    ({"use_muon": True, "optim": "sgd"}, "both choose the optimizer"),
    ({"use_galore": True, "galore_layerwise": True, "finetuning_type": "full", "gradient_accumulation_steps": 2},
     "gradient_accumulation_steps: 1"),
    ({"use_muon": True, "loraplus_lr_ratio": 16}, "cannot be combined"),
    ({"optim": "adamw_torhc"}, "Did you mean 'adamw_torch'"),
    ({"optim": "grokadamw"}, "needs the grokadamw package"),
    ({"stage": "ppo", "use_muon": True, "reward_funcs": ["length"]}, "stage: ppo trains with AdamW"),
    ({"use_galore": True, "finetuning_type": "full", "galore_rank": 0}, "'galore_rank' must be at least 1, got 0"),
    ({"use_apollo": True, "finetuning_type": "full", "apollo_update_interval": 0}, "'apollo_update_interval' must"),
    ({"use_badam": True, "finetuning_type": "full", "badam_switch_interval": -1}, "'badam_switch_interval' must"),
    ({"pissa_init": True, "pissa_iter": -2}, "'pissa_iter' is a number of fast-SVD iterations"),
    # An option of an optimizer the run does not use was read by nothing (the docs once said APOLLO shares
    # galore_target; its own is apollo_target):
    ({"galore_rank": 4}, "'galore_rank' tunes use_galore, which this run does not use: set use_galore: true"),
    ({"use_apollo": True, "finetuning_type": "full", "galore_target": "q_proj"},
     r"'galore_target' tunes use_galore, which this run does not use \(apollo's own keys are apollo_\*\)"),
    ({"finetuning_type": "full", "badam_mode": "ratio"}, "'badam_mode' tunes use_badam"),
])
def test_impossible_optimizer_settings_are_config_errors(keys, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args(keys)


def test_badam_under_zero3_is_a_config_error():
    args = SimpleNamespace(finetuning=SimpleNamespace(finetuning_type="full"),
                           training=SimpleNamespace(gradient_accumulation_steps=1,
                                                    deepspeed={"zero_optimization": {"stage": 3}}))
    with pytest.raises(ConfigError, match="DeepSpeed ZeRO-3"):
        OptimizerArguments(use_badam=True).validate(args)  # type: ignore[arg-type]
    args.training.deepspeed = {"zero_optimization": {"stage": 2}}
    OptimizerArguments(use_badam=True).validate(args)  # type: ignore[arg-type]


def test_loraplus_learning_rates_per_matrix(train_config, capture_trainer):
    """LoRA+ (Hayou et al., 2024): in the optimizer the run steps, every B matrix learns at learning_rate x
    loraplus_lr_ratio, every A matrix at learning_rate, and LoRA on the embeddings at loraplus_lr_embedding."""
    from gym.workflows.training import run_exp

    lr, ratio, embedding_lr = 1e-3, 16.0, 3e-5
    seen = capture_trainer(workflow)
    result = run_exp(train_config(lora_target="q_proj,v_proj,embed_tokens", learning_rate=lr, max_steps=1,
                                  loraplus_lr_ratio=ratio, loraplus_lr_embedding=embedding_lr))
    trainer = seen["trainer"]
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    names = {id(p): n for n, p in trainer.model.named_parameters() if p.requires_grad}
    # initial_lr: the group's rate before the schedule decayed it (to 0 at the last step)
    grouped = [(names[id(p)], group["initial_lr"]) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(n for n, _ in grouped) == sorted(names.values())  # every trainable parameter, in one group
    lr_of = dict(grouped)
    kinds = {"lora_A": lr, "lora_B": lr * ratio, "lora_embedding_A": embedding_lr, "lora_embedding_B": embedding_lr}
    by_kind = {kind: {rate for n, rate in lr_of.items() if kind in n.split(".")} for kind in kinds}
    assert by_kind == {kind: {rate} for kind, rate in kinds.items()}

    # ...and the step taken used them: Adam's first step moves each entry by its rate (|g| / (|g| + eps) ~ 1),
    # and what starts at zero (B of a linear layer, A of an embedding) is then at most that rate in size.
    adapter = load_file(str(Path(result.output_dir) / "adapter_model.safetensors"))
    largest = {kind: max(float(v.abs().max()) for k, v in adapter.items() if kind in k.split("."))
               for kind in ("lora_B", "lora_embedding_A")}
    assert largest == pytest.approx({"lora_B": lr * ratio, "lora_embedding_A": embedding_lr}, rel=1e-3)
