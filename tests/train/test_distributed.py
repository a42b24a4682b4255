"""`gym train` on several processes: when and how it relaunches itself under torchrun, and DDP on CPU processes
(gloo) ending with the weights a single process reaches on the same global batch; two "nodes" on one machine
(two torchrun invocations meeting on loopback) likewise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from gym.core.errors import ConfigError
from gym.train.launch import free_port, torchrun_command
from gym.train.run import run_exp


def test_no_relaunch_for_one_process_or_inside_torchrun():
    assert torchrun_command(["train", "c.yaml"], env={}, gpus=0) is None
    assert torchrun_command(["train", "c.yaml"], env={}, gpus=1) is None
    assert torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "LOCAL_RANK": "0"}) is None


def test_relaunch_reads_llamafactorys_variables():
    command = torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "MASTER_PORT": "29511"})
    assert command[1:3] == ["-m", "torch.distributed.run"] and command[-4:] == ["-m", "gym.cli", "train", "c.yaml"]
    flags = dict(zip(command[3:-4:2], command[4:-4:2]))
    assert flags == {"--nproc-per-node": "2", "--nnodes": "1", "--node-rank": "0", "--master-addr": "127.0.0.1",
                     "--master-port": "29511"}
    forced = torchrun_command(["train", "c.yaml"], env={"FORCE_TORCHRUN": "1"}, gpus=0)
    assert forced is not None and forced[forced.index("--nproc-per-node") + 1] == "1"
    gpus = torchrun_command(["train", "c.yaml"], env={}, gpus=4)
    assert gpus is not None and gpus[gpus.index("--nproc-per-node") + 1] == "4"


def test_elastic_and_multi_node_settings():
    elastic = torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "RDZV_ID": "job7", "MIN_NNODES": "1",
                                                         "MAX_NNODES": "3", "MAX_RESTARTS": "2",
                                                         "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert elastic is not None
    text = " ".join(elastic)
    assert "--nnodes 1:3 --rdzv-id job7 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --max-restarts 2" in text
    with pytest.raises(ConfigError, match="MASTER_PORT"):
        torchrun_command(["train", "c.yaml"], env={"NNODES": "2", "NPROC_PER_NODE": "1"})
    with pytest.raises(ConfigError, match="NPROC_PER_NODE must be a whole number"):
        torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "two"})


def _config(train_config, tmp_path: Path, name: str, per_device: int) -> dict:
    # Sequential order: one process's batch of 4 is exactly what two processes' batches of 2 make together.
    return train_config(output_dir=str(tmp_path / name), per_device_train_batch_size=per_device, max_steps=3,
                        train_sampling_strategy="sequential", learning_rate=5e-3)


def _gym_train(config: dict, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    path = tmp_path / f"{Path(config['output_dir']).name}-{env.get('NODE_RANK', 'x')}.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "gym.cli", "train", str(path)], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _same_adapter(a: Path, b: Path) -> None:
    first, second = load_file(str(a / "adapter_model.safetensors")), load_file(str(b / "adapter_model.safetensors"))
    assert first.keys() == second.keys() and first
    for key in first:
        assert torch.allclose(first[key], second[key], atol=2e-5), key


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_on_the_same_global_batch(train_config, tmp_path):
    single = run_exp(_config(train_config, tmp_path, "single", per_device=4))
    proc = _gym_train(_config(train_config, tmp_path, "ddp", per_device=2), tmp_path, {"NPROC_PER_NODE": "2"})
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert out.count("Done: 3 steps") == 1  # one summary: rank 0's
    _same_adapter(Path(single.output_dir), tmp_path / "ddp")
    log = (tmp_path / "ddp" / "trainer_log.jsonl").read_text().splitlines()
    assert len([line for line in log if '"loss"' in line]) == 3  # one log, written by rank 0


@pytest.mark.slow
def test_two_nodes_on_loopback_train_together(train_config, tmp_path):
    single = run_exp(_config(train_config, tmp_path, "single", per_device=4))
    config = _config(train_config, tmp_path, "nodes", per_device=2)
    port = str(free_port())
    nodes = [_gym_train(config, tmp_path, {"NNODES": "2", "NODE_RANK": str(rank), "NPROC_PER_NODE": "1",
                                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    _same_adapter(Path(single.output_dir), tmp_path / "nodes")
