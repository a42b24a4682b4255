"""`gym train` on many processes: relaunched under torchrun (PyTorch's own elastic launcher), never a home-made one.

When to relaunch, and how, is read from the environment with LLaMA-Factory's names, so its launch scripts work:

    NPROC_PER_NODE   processes on this machine (default: the visible GPUs)
    FORCE_TORCHRUN   1: relaunch even for one process (e.g. to test the distributed path on a CPU)
    NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT           a fixed multi-node job
    RDZV_ID (+ MIN_NNODES, MAX_NNODES, MAX_RESTARTS)      an elastic job with c10d rendezvous

Each process then runs the same `gym train` with torchrun's RANK/LOCAL_RANK/WORLD_SIZE set; the Hugging Face
Trainer (through accelerate) takes it from there: DDP over NCCL on GPUs, over gloo on CPUs. torchrun runs through
`gym.workflows.torchrun`, which ends a failed run in one line, and CPU ranks share the machine's cores.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from gym.core.errors import ConfigError

TRUE = ("1", "true", "yes", "on")


def launched_by_torchrun(env: Mapping[str, str]) -> bool:
    return "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def quiet_deepspeed_on_cpu() -> None:
    """Where DeepSpeed is installed, the libraries import it; without a GPU it then warns, in every process, that
    it fell back to the CPU. Telling it the CPU is meant (inherited by the processes torchrun starts) is quieter."""
    if "DS_ACCELERATOR" not in os.environ and importlib.util.find_spec("deepspeed") is not None and not _visible_gpus():
        os.environ["DS_ACCELERATOR"] = "cpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _whole(env: Mapping[str, str], key: str, default: str, least: int = 0) -> str:
    value = env.get(key, default)
    if not value.isdigit() or int(value) < least:
        kind = "a whole number" if least <= 0 else f"a whole number of at least {least}"
        raise ConfigError(f"{key} must be {kind}, got {value!r}.")
    return value


def torchrun_command(gym_args: list[str], env: Mapping[str, str] | None = None,
                     gpus: int | None = None, needs_launcher: bool = False) -> list[str] | None:
    """The torchrun command that runs `gym <gym_args>` on every process of this node; None: run here, as is.
    `needs_launcher`: the run needs a process group even on one process (DeepSpeed), so it is relaunched anyway."""
    env = os.environ if env is None else env
    if launched_by_torchrun(env):
        return None
    force = needs_launcher or env.get("FORCE_TORCHRUN", "").lower() in TRUE
    if not force and "NPROC_PER_NODE" not in env and env.get("NNODES", "1") == "1":
        gpus = _visible_gpus() if gpus is None else gpus
        if gpus <= 1:
            return None
    nproc = _whole(env, "NPROC_PER_NODE", str(max(1, _visible_gpus() if gpus is None else gpus)), least=1)
    nnodes = _whole(env, "NNODES", "1", least=1)
    if int(nproc) <= 1 and nnodes == "1" and not force:
        return None
    master_addr = env.get("MASTER_ADDR", "127.0.0.1")
    if int(nnodes) > 1 and "MASTER_PORT" not in env:
        raise ConfigError("NNODES > 1: set MASTER_ADDR and MASTER_PORT to the same values on every node.")
    master_port = _whole(env, "MASTER_PORT", str(free_port()))
    command = [sys.executable, "-m", "gym.workflows.torchrun", "--nproc-per-node", nproc]
    if "RDZV_ID" in env:
        low, high = env.get("MIN_NNODES"), env.get("MAX_NNODES")
        command += ["--nnodes", f"{low}:{high}" if low and high else nnodes, "--rdzv-id", env["RDZV_ID"],
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master_addr}:{master_port}",
                    "--max-restarts", _whole(env, "MAX_RESTARTS", "0")]
    else:
        command += ["--nnodes", nnodes, "--node-rank", _whole(env, "NODE_RANK", "0"),
                    "--master-addr", master_addr, "--master-port", master_port]
    return [*command, "-m", "gym.cli", *gym_args]


def check_as_a_rank(values: dict[str, Any], launcher: list[str]) -> None:
    """Parse and validate the config as the first rank of `launcher` will: the checks that read the process's
    place (FSDP needs a world of 2 or more, DeepSpeed a launcher's LOCAL_RANK) see the world torchrun will make."""
    from gym.config.parser import get_train_args

    nproc = int(launcher[launcher.index("--nproc-per-node") + 1])
    nnodes = int(launcher[launcher.index("--nnodes") + 1].split(":")[-1])
    rank_env = {"WORLD_SIZE": str(nproc * nnodes), "LOCAL_WORLD_SIZE": str(nproc), "RANK": "0", "LOCAL_RANK": "0"}
    saved = {key: os.environ.get(key) for key in rank_env}
    os.environ.update(rank_env)
    try:
        get_train_args(values)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def launch_elsewhere(argv: list[str], values: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """`gym train argv` where the run needs other processes: on Ray workers (USE_RAY=1), or under torchrun (several
    processes, several nodes, or DeepSpeed). Returns the config to run here (Ray's keys taken out) and None, or the
    exit code of the run that happened elsewhere."""
    from gym.config.distributed import needs_launcher
    from gym.workflows.ray_launch import run_on_ray, split_settings, use_ray

    quiet_deepspeed_on_cpu()
    values, ray_settings = split_settings(values)
    if use_ray():
        return values, run_on_ray(values, ray_settings)
    launcher = torchrun_command(["train", *argv], needs_launcher=needs_launcher(values))
    if launcher is None:
        return values, None
    # Checked here, once, before torchrun starts: a bad key is then one line and exit 2, where each rank would say
    # it in turn inside torchrun's traceback (and exit 1).
    check_as_a_rank(values, launcher)
    return values, wait_for_launcher(launcher, rank_environment(launcher))


def wait_for_launcher(launcher: list[str], env: dict[str, str]) -> int:
    """Run torchrun and wait for it. Ctrl-C reaches torchrun as well (one process group), and it passes the stop
    on to the ranks, which save a checkpoint first; so this process ignores SIGINT while it waits, where Python's
    subprocess would answer it by killing torchrun a quarter of a second later and leave the ranks on their own."""
    import signal
    import subprocess
    import threading

    launched = subprocess.Popen(launcher, env=env)
    if threading.current_thread() is not threading.main_thread():
        return launched.wait()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return launched.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def rank_environment(launcher: list[str], env: Mapping[str, str] | None = None,
                     cpus: int | None = None, gpus: int | None = None) -> dict[str, str]:
    """The environment the ranks start with. torchrun gives every process of a node one compute thread when
    OMP_NUM_THREADS is unset, which suits GPU ranks; CPU ranks compute on the CPU, so they share this machine's
    cores instead (16 cores, 2 processes: 8 threads each, not 1). A value the user set is kept."""
    env = dict(os.environ if env is None else env)
    if "OMP_NUM_THREADS" in env or (_visible_gpus() if gpus is None else gpus):
        return env
    nproc = int(launcher[launcher.index("--nproc-per-node") + 1])
    if cpus is None:  # the cores this process may run on (a container's or taskset's share), where the OS says
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    return env
