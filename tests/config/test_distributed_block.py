"""The seeds' `distributed:` block becomes the Trainer's own keys (fsdp, deepspeed, ddp_backend, bf16), and a
combination that cannot work is refused before any process starts; the shipped DeepSpeed configs are the ones the
block builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym.config.distributed import deepspeed_config, expand, needs_launcher
from gym.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_seeds_block_maps_onto_fsdp2():
    seeds = {"distributed": {"backend": "nccl", "strategy": "fsdp", "sharding_strategy": "full_shard",
                             "mixed_precision": "bf16"}, "stage": "sft"}
    assert expand(seeds, cuda=True) == {"stage": "sft", "ddp_backend": "nccl", "fsdp": True,
                                        "fsdp_config": {"version": 2, "reshard_after_forward": True},
                                        "bf16": True, "fp16": False}
    grad_op = expand({"distributed": {"strategy": "fsdp", "sharding_strategy": "shard_grad_op", "cpu_offload": True},
                      "fsdp_config": {"min_num_params": 10}})
    assert grad_op["fsdp_config"] == {"min_num_params": 10, "version": 2, "reshard_after_forward": False,
                                      "cpu_offload": True}


def test_nccl_on_a_machine_without_cuda_suggests_gloo():
    with pytest.raises(ConfigError, match="backend: nccl' runs between CUDA GPUs.*'backend: gloo'"):
        expand({"distributed": {"backend": "nccl", "strategy": "fsdp"}}, cuda=False)
    assert expand({"distributed": {"backend": "gloo"}}, cuda=False) == {"ddp_backend": "gloo"}


def test_deepspeed_strategy_builds_the_zero_config_and_needs_the_launcher():
    config = {"distributed": {"strategy": "deepspeed", "zero_stage": 3, "offload": True}}
    assert needs_launcher(config) and needs_launcher({"deepspeed": "ds.json"}) and not needs_launcher({})
    assert expand(config)["deepspeed"] == deepspeed_config(3, offload=True)
    assert expand(config)["deepspeed"]["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}


@pytest.mark.parametrize(("block", "message"), [
    ({"strategy": "fsdp2x"}, "'distributed.strategy' is one of ddp, fsdp, deepspeed.*Did you mean 'fsdp'"),
    ({"sharding_strategy": "full_shard"}, "applies to strategy: fsdp, and this block's strategy is ddp"),
    ({"strategy": "fsdp", "sharding_strategy": "hybrid_shard"}, "'distributed.sharding_strategy' is one of "
                                                                "full_shard, shard_grad_op"),
    ({"strategy": "deepspeed", "zero_stage": 5}, "zero_stage' is 0, 1, 2 or 3"),
    ({"strategy": "deepspeed", "zero_stage": 1, "offload": True}, "needs zero_stage 2 or 3"),
    ({"stratgy": "fsdp"}, "Unknown key 'distributed.stratgy'. Did you mean 'strategy'"),
    ({"mixed_precision": "bf8"}, "'distributed.mixed_precision' is one of bf16, fp16, no"),
])
def test_what_cannot_work_is_refused_naming_the_key(block, message):
    with pytest.raises(ConfigError, match=message):
        expand({"distributed": block}, cuda=False)


def test_the_block_and_a_flat_key_that_disagree_are_refused():
    with pytest.raises(ConfigError, match="sets 'bf16: False', and the config also has 'bf16: True'"):
        expand({"distributed": {"mixed_precision": "fp16"}, "bf16": True})
    with pytest.raises(ConfigError, match="chooses FSDP, and the config also has 'fsdp: shard_grad_op'"):
        expand({"distributed": {"strategy": "fsdp"}, "fsdp": "shard_grad_op"})


@pytest.mark.parametrize(("name", "stage", "offload"), [("ds_z0", 0, False), ("ds_z2", 2, False),
                                                        ("ds_z2_offload", 2, True), ("ds_z3", 3, False),
                                                        ("ds_z3_offload", 3, True)])
def test_the_shipped_deepspeed_configs_are_the_blocks_own(name, stage, offload):
    shipped = json.loads((REPO / "examples" / "deepspeed" / f"{name}.json").read_text())
    assert shipped == deepspeed_config(stage, offload)


def test_the_parser_reads_the_block_and_fsdp_needs_several_processes(train_config):
    from gym.config.parser import get_train_args

    with pytest.raises(ConfigError, match="'fsdp' shards the model across processes, and this is one process"):
        get_train_args(train_config(distributed={"strategy": "fsdp"}))
    with pytest.raises(ConfigError, match="Unknown key 'distributed.backnd'"):
        get_train_args(train_config(distributed={"backnd": "gloo"}))
