"""Sharded runs (FSDP2, DeepSpeed ZeRO-3): FSDP and DeepSpeed on CPU processes, how much of the model each process
holds, and gathering the full weights onto rank 0 for the final save.

accelerate turns `fsdp` on only for accelerator devices (CUDA, XPU, NPU, ...); on CPU processes it silently trains
plain DDP instead, so a config asking for sharding would not shard. torch's FSDP2 (`fully_shard`) runs on CPU over
gloo, and accelerate's FSDP2 path has no device-specific step, so Gym switches the run to FSDP itself there.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def enable_fsdp_on_cpu(trainer: Any) -> None:
    """A run with `fsdp` on CPU processes shards its model as it would on GPUs (FSDP2 over gloo)."""
    plugin_args = getattr(trainer.args, "fsdp_plugin_args", None)
    if not plugin_args:
        return
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    from accelerate.state import PartialState

    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    state.distributed_type = DistributedType.FSDP
    # Every later `AcceleratorState()` copies PartialState's fields over its own, so the switch must be made there
    # too, as accelerate does when it chooses FSDP itself: otherwise the first checkpoint after the first step
    # reads the run as plain DDP and hands PEFT the sharded tensors instead of the gathered ones.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


class ShardReport(TrainerCallback):
    """Says, once sharding is in place, how much of the model this process holds, so a run (and a test) can see
    that FSDP sharded rather than replicated."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None or not is_sharded(model) or not state.is_world_process_zero:
            return
        local, total = held_parameters(model)
        logger.info("Sharded: this process holds %s of the model's %s parameters.", f"{local:,}", f"{total:,}")


def connect_deepspeed(training_args: Any) -> None:
    """DeepSpeed's communication layer joins the process group accelerate opened on CPU processes.

    accelerate starts DeepSpeed's layer only on accelerator devices; on CPUs it opens a plain gloo group, and
    ZeRO-3's sharded model loading (`deepspeed.zero.Init`) then sees one process and refuses the batch sizes."""
    if not getattr(training_args, "deepspeed", None):
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from deepspeed import comm

    if not comm.is_initialized():
        comm.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)


def is_sharded(model: Any) -> bool:
    """FSDP2 (parameters are DTensors) or DeepSpeed ZeRO-3 (parameters carry a `ds_id`, their data partitioned)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


def held_parameters(model: Any) -> tuple[int, int]:
    """(parameters stored on this process, parameters in the whole model)."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for p in model.parameters():
        if isinstance(p, DTensor):
            local, total = local + p.to_local().numel(), total + p.numel()
        elif hasattr(p, "ds_id"):  # ZeRO-3: the module holds an empty placeholder, the slice is ds_tensor
            local, total = local + p.ds_tensor.numel(), total + p.ds_numel
        else:
            local, total = local + p.numel(), total + p.numel()
    return local, total


def full_state_dict(model: Any) -> dict[str, Any] | None:
    """The model's whole state, gathered from every rank onto rank 0's CPU memory (other ranks get an empty dict).
    Every rank must call it: gathering is collective. None when the model is not sharded (save it as it is)."""
    if not is_sharded(model):
        return None
    import torch.distributed as dist

    if any(hasattr(p, "ds_id") for p in model.parameters()):
        import deepspeed

        # ZeRO-3: each rank holds a slice of every parameter; gathered, the module's own state_dict is whole.
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            if dist.get_rank() != 0:
                return {}
            return {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
