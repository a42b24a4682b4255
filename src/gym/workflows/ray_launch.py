"""`USE_RAY=1 gym train CONFIG`: the same training function on Ray workers, through Ray Train's TorchTrainer.

Ray Train starts one worker per `ray_num_workers`, opens the torch process group between them and sets torchrun's
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR), so each worker runs Gym's ordinary training as one rank of a
DDP (or FSDP, or DeepSpeed) run; Gym adds no distribution of its own. The keys are LLaMA-Factory's:

    ray_num_workers: 4                 # one rank each (default 1)
    resources_per_worker: {GPU: 1}     # default: one GPU where there are GPUs, else one CPU
    placement_strategy: PACK           # PACK, SPREAD, STRICT_PACK or STRICT_SPREAD
    ray_run_name: my_run               # Ray's name for the run
    ray_storage_path: /shared/ray      # where Ray keeps the run's records (Ray's default: ~/ray_results)
    ray_init_kwargs: {address: auto}   # passed to ray.init (default: start or join a local Ray)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gym.core.errors import ConfigError, GymError

TRUE = ("1", "true", "yes", "on")  # as gym.workflows.launch reads its flags (which imports this module: no cycle)

KEYS = ("ray_num_workers", "resources_per_worker", "placement_strategy", "ray_run_name", "ray_storage_path",
        "ray_init_kwargs")
PLACEMENT = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def use_ray(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("USE_RAY", "").lower() in TRUE


def split_settings(values: dict[str, Any], env: Mapping[str, str] | None = None) -> tuple[dict[str, Any],
                                                                                           dict[str, Any]]:
    """(the training config without Ray's keys, Ray's keys). Ray's keys without USE_RAY=1 are refused: they would
    otherwise be silently ignored and the run would train on one process."""
    ray = {k: v for k, v in values.items() if k in KEYS}
    if ray and not use_ray(env):
        raise ConfigError(f"'{next(iter(ray))}' is read when Ray runs the training: USE_RAY=1 gym train ... "
                          "(pip install 'zoo-gym[ray]'; docs/distributed.md).")
    workers = ray.get("ray_num_workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"'ray_num_workers' must be a whole number of at least 1, got {workers!r}.")
    strategy = str(ray.get("placement_strategy", "PACK")).upper()
    if strategy not in PLACEMENT:
        raise ConfigError(f"'placement_strategy' is one of {', '.join(PLACEMENT)}, got {ray['placement_strategy']!r}.")
    for key in ("resources_per_worker", "ray_init_kwargs"):
        if key in ray and not isinstance(ray[key], dict):
            raise ConfigError(f"'{key}' is a mapping (e.g. {{GPU: 1}}), got {ray[key]!r}.")
    return {k: v for k, v in values.items() if k not in KEYS}, {**ray, "placement_strategy": strategy}


def train_worker(config: dict[str, Any]) -> None:
    """One Ray worker: an ordinary `gym train` as the rank Ray Train gave it."""
    from gym.config.parser import get_train_args
    from gym.train.ranks import is_main_process
    from gym.workflows.training import run_exp

    result = run_exp(get_train_args(config["values"]))
    if is_main_process():
        print(result.summary(), flush=True)


def run_on_ray(values: dict[str, Any], ray_settings: dict[str, Any]) -> int:
    """Train `values` on `ray_num_workers` Ray workers; 0 when the run finished."""
    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError:
        raise GymError("USE_RAY=1 needs Ray Train: pip install 'zoo-gym[ray]'.") from None
    import torch

    from gym.config.parser import get_train_args

    get_train_args(values)  # a config error is reported here, once, before any worker starts
    gpu = torch.cuda.is_available()
    resources = ray_settings.get("resources_per_worker") or ({"GPU": 1} if gpu else {"CPU": 1})
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray would otherwise report usage over the network
    if not ray.is_initialized():
        ray.init(**ray_settings.get("ray_init_kwargs", {}))
    run_config: dict[str, Any] = {"name": ray_settings.get("ray_run_name")}
    if ray_settings.get("ray_storage_path"):
        run_config["storage_path"] = os.path.abspath(str(ray_settings["ray_storage_path"]))
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"values": values},
        scaling_config=ScalingConfig(num_workers=int(ray_settings.get("ray_num_workers", 1)),
                                     use_gpu="GPU" in resources, resources_per_worker=resources,
                                     placement_strategy=ray_settings["placement_strategy"]),
        run_config=RunConfig(**run_config),
    )
    result = trainer.fit()
    if result.error is not None:
        raise GymError(f"The Ray run failed: {result.error}")
    return 0
