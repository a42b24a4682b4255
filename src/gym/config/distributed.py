"""The `distributed:` block of Gym's documents, mapped onto the keys the Hugging Face Trainer reads:

    distributed:
      backend: nccl            # ddp_backend: nccl (CUDA GPUs), gloo (CPU processes), ...
      strategy: fsdp           # ddp | fsdp | deepspeed
      sharding_strategy: full_shard   # fsdp: full_shard | shard_grad_op
      cpu_offload: false       # fsdp: parameters and optimizer state kept in CPU memory
      zero_stage: 2            # deepspeed: 0 | 1 | 2 | 3
      offload: false           # deepspeed: optimizer state (and, at stage 3, parameters) in CPU memory
      mixed_precision: bf16    # bf16 | fp16 | no

The number of processes is not a config key: it is how the run is launched (NPROC_PER_NODE, NNODES;
docs/distributed.md). A combination that cannot work is refused here, before any process starts.
"""

from __future__ import annotations

from typing import Any

from gym.config.aliases import block_of, set_flat
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

BLOCK = "distributed"
KEYS = ("backend", "strategy", "sharding_strategy", "cpu_offload", "zero_stage", "offload", "mixed_precision")
STRATEGIES = ("ddp", "fsdp", "deepspeed")
BACKENDS = ("nccl", "gloo", "mpi", "ccl", "hccl", "cncl", "mccl")
# FSDP2 (what transformers 5 runs) has two ways to shard: free the gathered parameters after the forward pass, or
# keep them until the backward pass. FSDP1's hybrid_shard and no_shard have no FSDP2 equivalent here.
SHARDING = {"full_shard": True, "shard_grad_op": False}


def deepspeed_config(stage: int, offload: bool = False) -> dict[str, Any]:
    """A ZeRO config with the Trainer's values left as "auto" (the same as examples/deepspeed/ds_z<stage>*.json)."""
    zero: dict[str, Any] = {"stage": stage}
    if stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=500_000_000, overlap_comm=False,
                    reduce_scatter=True, reduce_bucket_size=500_000_000, contiguous_gradients=True,
                    round_robin_gradients=True)
    if stage == 3:
        zero.update(overlap_comm=False, contiguous_gradients=True, sub_group_size=1_000_000_000,
                    reduce_bucket_size="auto", stage3_prefetch_bucket_size="auto",
                    stage3_param_persistence_threshold="auto", stage3_max_live_parameters=1_000_000_000,
                    stage3_max_reuse_distance=1_000_000_000, stage3_gather_16bit_weights_on_model_save=True)
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).lower()
    if text not in choices:
        raise ConfigError(f"'{BLOCK}.{key}' is one of {', '.join(choices)}; got {value!r}."
                          f"{did_you_mean(text, choices)}")
    return text


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"'{BLOCK}.{key}' expects true or false, got {value!r}.")


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    set_flat(config, BLOCK, key, value)


def expand(config: dict[str, Any], cuda: bool | None = None) -> dict[str, Any]:
    """The config with its `distributed:` block replaced by the flat keys it means."""
    if BLOCK not in config:
        return config
    block = block_of(config, BLOCK, KEYS)
    out = {k: v for k, v in config.items() if k != BLOCK}
    strategy = _choice("strategy", block.get("strategy", "ddp"), STRATEGIES)
    for key, owner in (("sharding_strategy", "fsdp"), ("cpu_offload", "fsdp"), ("zero_stage", "deepspeed"),
                       ("offload", "deepspeed")):
        if key in block and strategy != owner:
            raise ConfigError(f"'{BLOCK}.{key}' applies to strategy: {owner}, and this block's strategy is "
                              f"{strategy}.")

    if "backend" in block:
        backend = _choice("backend", block["backend"], BACKENDS)
        if cuda is None:
            import torch

            cuda = bool(torch.cuda.is_available())
        if backend == "nccl" and not cuda:
            raise ConfigError(f"'{BLOCK}.backend: nccl' runs between CUDA GPUs, and this machine has none: use "
                              "'backend: gloo' to train on CPU processes (or leave it out: the default fits the "
                              "machine).")
        _set(out, "ddp_backend", backend)

    if strategy == "fsdp":
        sharding = _choice("sharding_strategy", block.get("sharding_strategy", "full_shard"), tuple(SHARDING))
        fsdp_config = dict(out.pop("fsdp_config", None) or {})
        fsdp_config.setdefault("version", 2)
        fsdp_config.setdefault("reshard_after_forward", SHARDING[sharding])
        if "cpu_offload" in block:
            fsdp_config.setdefault("cpu_offload", _flag("cpu_offload", block["cpu_offload"]))
        if out.get("fsdp") not in (None, True):
            raise ConfigError(f"'{BLOCK}:' chooses FSDP, and the config also has 'fsdp: {out['fsdp']}'; keep one.")
        out["fsdp"], out["fsdp_config"] = True, fsdp_config
    elif strategy == "deepspeed":
        stage = block.get("zero_stage", 2)
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f"'{BLOCK}.zero_stage' is 0, 1, 2 or 3; got {stage!r}.")
        offload = _flag("offload", block.get("offload", False))
        if offload and stage < 2:
            raise ConfigError(f"'{BLOCK}.offload' moves ZeRO's partitioned state to the CPU: it needs zero_stage 2 "
                              f"or 3, got {stage}.")
        _set(out, "deepspeed", deepspeed_config(stage, offload))

    precision = block.get("mixed_precision")
    if precision is not None:
        precision = _choice("mixed_precision", precision, ("bf16", "fp16", "no", "fp32"))
        _set(out, "bf16", precision == "bf16")
        _set(out, "fp16", precision == "fp16")
    return out


def needs_launcher(config: dict[str, Any]) -> bool:
    """DeepSpeed needs a process group even for one process, so `gym train` starts torchrun for it."""
    block = config.get(BLOCK)
    return bool(config.get("deepspeed")) or (isinstance(block, dict) and block.get("strategy") == "deepspeed")
