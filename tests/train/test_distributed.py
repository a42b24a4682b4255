"""`gym train` on several processes: when and how it relaunches itself under torchrun; then DDP, FSDP2 and DeepSpeed
ZeRO-3 on CPU processes (gloo), a DPO run under DDP, two "nodes" on one machine (two torchrun invocations meeting on
loopback), and a 2-process checkpoint resumed on 1 and on 2 processes. Each ends with the weights a single process
reaches on the same global batch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from gym.core.errors import ConfigError
from gym.workflows.launch import free_port, torchrun_command
from gym.workflows.training import run_exp

REPO = Path(__file__).resolve().parents[2]


def test_no_relaunch_for_one_process_or_inside_torchrun():
    assert torchrun_command(["train", "c.yaml"], env={}, gpus=0) is None
    assert torchrun_command(["train", "c.yaml"], env={}, gpus=1) is None
    assert torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "LOCAL_RANK": "0"}) is None


def test_relaunch_reads_llamafactorys_variables():
    command = torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "MASTER_PORT": "29511"})
    assert command[1:3] == ["-m", "gym.workflows.torchrun"] and command[-4:] == ["-m", "gym.cli", "train", "c.yaml"]
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
    with pytest.raises(ConfigError, match="NPROC_PER_NODE must be a whole number of at least 1, got '0'"):
        torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "0"})  # it ran on one process, saying nothing


def test_a_config_error_of_a_relaunched_run_is_one_line_before_torchrun_starts(tmp_path, monkeypatch, capsys):
    """Each rank said it inside torchrun's traceback, exit 1; the launcher checks the config first."""
    from gym.cli import main
    from gym.workflows import launch

    monkeypatch.setenv("NPROC_PER_NODE", "2")
    started: list[object] = []
    monkeypatch.setattr(launch, "wait_for_launcher", lambda *a, **k: started.append(a) or 0)
    config = tmp_path / "c.yaml"
    config.write_text("distributed: {strategey: fsdp}\n")
    assert main(["train", str(config)]) == 2
    assert "Unknown key 'distributed.strategey'. Did you mean 'strategy'?" in capsys.readouterr().err
    assert started == []
    # checked as a rank of the world torchrun will make: FSDP on 2 processes passes and is launched
    config.write_text("distributed: {strategy: fsdp, backend: gloo}\n")
    assert main(["train", str(config)]) == 0 and len(started) == 1
    assert "WORLD_SIZE" not in os.environ and "LOCAL_RANK" not in os.environ


def _config(train_config, tmp_path: Path, name: str, per_device: int, **overrides) -> dict:
    # Sequential order: one process's batch of 4 is exactly what two processes' batches of 2 make together. float32
    # on every machine: these are equalities of arithmetic, which bf16 autocast (on where the CPU has native bf16)
    # rounds differently for a batch of 4 and two of 2.
    return train_config(**{"output_dir": str(tmp_path / name), "per_device_train_batch_size": per_device,
                           "max_steps": 3, "train_sampling_strategy": "sequential", "learning_rate": 5e-3,
                           "bf16": False, **overrides})


def _gym_train(config: dict, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    path = tmp_path / f"{Path(config['output_dir']).name}-{env.get('NODE_RANK', 'x')}.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "gym.cli", "train", str(path)], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return out


def _held_share(out: str) -> float:
    """The share of the model's parameters rank 0 said it holds."""
    found = re.search(r"Sharded: this process holds ([\d,]+) of the model's ([\d,]+) parameters", out)
    assert found, out[-3000:]
    held, total = (int(n.replace(",", "")) for n in found.groups())
    return held / total


def _same_adapter(a: Path, b: Path) -> None:
    first, second = load_file(str(a / "adapter_model.safetensors")), load_file(str(b / "adapter_model.safetensors"))
    assert first.keys() == second.keys() and first
    for key in first:
        assert torch.allclose(first[key], second[key], atol=2e-5), key


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


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_shards_the_model_equals_one_process_and_resumes_its_checkpoint(train_config,
                                                                                                tmp_path):
    # accelerate alone would train plain DDP here; the seeds' block turns on FSDP2, which Gym runs on CPU processes.
    # The checkpoint at step 2 is written mid-run, after accelerate has re-read its state: it must still be gathered.
    def config(name: str, per_device: int, steps: int, **overrides) -> dict:
        return _config(train_config, tmp_path, name, per_device=per_device, max_steps=steps,
                       lr_scheduler_type="constant", save_strategy="steps", save_steps=2, **overrides)

    fsdp = {"backend": "gloo", "strategy": "fsdp", "sharding_strategy": "full_shard"}
    single = run_exp(config("single", 4, 4))
    out = _finish(_gym_train(config("fsdp", 2, 4, distributed=fsdp), tmp_path, {"NPROC_PER_NODE": "2"}))
    assert 0.45 < _held_share(out) < 0.55  # each process holds half the model: sharded, not replicated
    _same_adapter(Path(single.output_dir) / "checkpoint-2", tmp_path / "fsdp" / "checkpoint-2")
    _same_adapter(Path(single.output_dir), tmp_path / "fsdp")  # gathered before saving: full, not empty
    shutil.rmtree(tmp_path / "fsdp" / "checkpoint-4")
    _finish(_gym_train(config("fsdp", 2, 4, distributed=fsdp, resume_from_checkpoint=True), tmp_path,
                       {"NPROC_PER_NODE": "2"}))
    _same_adapter(Path(single.output_dir), tmp_path / "fsdp")  # the resumed run ends where the whole one did


def test_a_deepspeed_config_is_launched_under_torchrun_and_refused_outside_a_launcher(train_config):
    """What make test checks of DeepSpeed without running it (its first run compiles DeepSpeed's CPU communication
    op, minutes on a slow machine): `gym train` relaunches a DeepSpeed config under torchrun even for one process,
    and a DeepSpeed config outside a launcher is refused before anything loads. The runs themselves, ZeRO-3's
    gathered save included, are `make test-deepspeed`."""
    pytest.importorskip("deepspeed", reason="pip install 'zoo-gym[deepspeed]'")
    from gym.config.distributed import needs_launcher
    from gym.config.parser import get_train_args
    from gym.core.errors import ConfigError

    config = train_config(deepspeed=str(REPO / "examples" / "deepspeed" / "ds_z3.json"))
    assert needs_launcher(config) and needs_launcher(train_config(distributed={"strategy": "deepspeed"}))
    assert not needs_launcher(train_config())
    command = torchrun_command(["train", "c.yaml"], env={}, gpus=0, needs_launcher=True)
    assert command is not None and "--nproc-per-node" in command and command[-3:] == ["gym.cli", "train", "c.yaml"]
    with pytest.raises(ConfigError, match="runs in processes started by a launcher"):
        get_train_args(config)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GYM_TEST_ALL_ZERO"), reason="opt-in: make test-deepspeed")
def test_deepspeed_zero3_on_two_cpu_processes_saves_the_gathered_adapter(train_config, tmp_path):
    pytest.importorskip("deepspeed", reason="pip install 'zoo-gym[deepspeed]'")
    single = run_exp(_config(train_config, tmp_path, "single", per_device=4))
    config = _config(train_config, tmp_path, "zero3", per_device=2,
                     deepspeed=str(REPO / "examples" / "deepspeed" / "ds_z3.json"))
    out = _finish(_gym_train(config, tmp_path, {"NPROC_PER_NODE": "2"}))
    assert 0.45 < _held_share(out) < 0.55
    _same_adapter(Path(single.output_dir), tmp_path / "zero3")


@pytest.mark.slow
def test_dpo_under_ddp_equals_one_process(pairs_config, tmp_path):
    # The reference is the base with the adapter disabled, on every rank; the loss is a mean over pairs.
    def config(name: str, per_device: int) -> dict:
        return pairs_config(output_dir=str(tmp_path / name), per_device_train_batch_size=per_device, bf16=False,
                            train_sampling_strategy="sequential", learning_rate=5e-3)

    single = run_exp(config("single", 4))
    _finish(_gym_train(config("ddp", 2), tmp_path, {"NPROC_PER_NODE": "2"}))
    _same_adapter(Path(single.output_dir), tmp_path / "ddp")


@pytest.mark.slow
def test_grpo_under_ddp_generates_on_every_rank_and_logs_once(prompt_config, tmp_path):
    # Sampling makes two processes differ from one, so this checks the run itself: each rank generates for its
    # own prompts (2 per device, 2 generations each), the rewards are gathered, rank 0 logs every step once.
    config = prompt_config(stage="grpo", output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=2,
                           num_generations=2, max_steps=2)
    out = _finish(_gym_train(config, tmp_path, {"NPROC_PER_NODE": "2"}))
    assert out.count("Done: 2 steps") == 1
    log = [line for line in (tmp_path / "grpo" / "trainer_log.jsonl").read_text().splitlines() if '"reward"' in line]
    assert len(log) == 2
    assert load_file(str(tmp_path / "grpo" / "adapter_model.safetensors"))


@pytest.mark.slow
def test_ppo_under_ddp_splits_the_rollout_and_keeps_the_ranks_in_step(prompt_config, tmp_path):
    # Gym's own loop: each process generates for its half of the global rollout, the advantages are whitened
    # over all of it, gradients are averaged, and the run ends by checking every process holds the same weights.
    config = prompt_config(stage="ppo", output_dir=str(tmp_path / "ppo"), per_device_train_batch_size=2,
                           ppo_buffer_size=1, ppo_epochs=1, max_steps=2)
    out = _finish(_gym_train(config, tmp_path, {"NPROC_PER_NODE": "2"}))
    assert "PPO: 2 steps of 4 rollouts" in out and out.count("Done: 2 steps") == 1
    log = [line for line in (tmp_path / "ppo" / "trainer_log.jsonl").read_text().splitlines() if '"reward"' in line]
    assert len(log) == 2
    assert (tmp_path / "ppo" / "value_head.safetensors").is_file()


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_and_its_checkpoint_resumes_on_one_process_and_on_two(train_config,
                                                                                                 tmp_path):
    # A constant learning rate, so stopping at step 2 and going on to 4 is the same schedule as 4 steps at once.
    def config(name: str, per_device: int, steps: int, **overrides) -> dict:
        return _config(train_config, tmp_path, name, per_device=per_device, max_steps=steps,
                       lr_scheduler_type="constant", save_strategy="steps", save_steps=2, **overrides)

    single = run_exp(config("single", 4, 4))
    out = _finish(_gym_train(config("two", 2, 2), tmp_path, {"NPROC_PER_NODE": "2"}))
    # Two processes' batches of 2 step as one process's batch of 4: the same adapter at step 2.
    _same_adapter(Path(single.output_dir) / "checkpoint-2", tmp_path / "two")
    assert out.count("Done: 2 steps") == 1  # one summary: rank 0's
    assert out.count("Trainable parameters") == 1  # rank 1's notes would repeat rank 0's
    assert "find_unused_parameters" not in out  # LoRA: DDP is not asked to search for unused weights
    log = (tmp_path / "two" / "trainer_log.jsonl").read_text().splitlines()
    assert len([line for line in log if '"loss"' in line]) == 2  # one log, written by rank 0
    assert (tmp_path / "two" / "checkpoint-2" / "rng_state_1.pth").is_file()  # one random state per rank
    for name in ("on-one", "on-two"):
        shutil.copytree(tmp_path / "two", tmp_path / name)
    run_exp(config("on-one", 4, 4, resume_from_checkpoint=True))
    _finish(_gym_train(config("on-two", 2, 4, resume_from_checkpoint=True), tmp_path, {"NPROC_PER_NODE": "2"}))
    for name in ("on-one", "on-two"):
        assert (tmp_path / name / "checkpoint-4").is_dir()
        _same_adapter(Path(single.output_dir), tmp_path / name)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GYM_TEST_ALL_ZERO"), reason="opt-in: make test-deepspeed")
@pytest.mark.parametrize("name", ["ds_z0", "ds_z2", "ds_z2_offload", "ds_z3", "ds_z3_offload"])
def test_every_shipped_deepspeed_config_trains_on_two_cpu_processes(name, train_config, tmp_path):
    pytest.importorskip("deepspeed", reason="pip install 'zoo-gym[deepspeed]'")
    single = run_exp(_config(train_config, tmp_path, "single", per_device=4))
    config = _config(train_config, tmp_path, name, per_device=2,
                     deepspeed=str(REPO / "examples" / "deepspeed" / f"{name}.json"))
    _finish(_gym_train(config, tmp_path, {"NPROC_PER_NODE": "2"}))
    _same_adapter(Path(single.output_dir), tmp_path / name)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GYM_TEST_RAY"), reason="opt-in: make test-ray")
def test_ray_workers_train_as_ddp_ranks_and_equal_one_process(train_config, tmp_path):
    pytest.importorskip("ray.train", reason="pip install 'zoo-gym[ray]'")
    single = run_exp(_config(train_config, tmp_path, "single", per_device=4))
    config = _config(train_config, tmp_path, "ray", per_device=2, ray_num_workers=2,
                     ray_storage_path=str(tmp_path / "ray-records"))
    out = _finish(_gym_train(config, tmp_path, {"USE_RAY": "1"}))
    assert "world_rank=1" in out  # Ray started the second rank
    _same_adapter(Path(single.output_dir), tmp_path / "ray")


def test_ray_keys_without_use_ray_are_refused(train_config, tmp_path):
    from gym.workflows.ray_launch import split_settings

    with pytest.raises(ConfigError, match="'ray_num_workers' is read when Ray runs the training: USE_RAY=1"):
        split_settings(train_config(ray_num_workers=2), env={})
    values, ray = split_settings(train_config(ray_num_workers=2, placement_strategy="spread"), env={"USE_RAY": "1"})
    assert "ray_num_workers" not in values and ray == {"ray_num_workers": 2, "placement_strategy": "SPREAD"}
    with pytest.raises(ConfigError, match="'ray_num_workers' must be a whole number of at least 1"):
        split_settings(train_config(ray_num_workers=0), env={"USE_RAY": "1"})


def test_cpu_ranks_share_the_cores_and_a_thread_count_the_user_set_is_kept():
    from gym.workflows.launch import rank_environment

    launcher = torchrun_command(["train", "c.yaml"], env={"NPROC_PER_NODE": "2", "MASTER_PORT": "29511"})
    assert launcher is not None
    assert rank_environment(launcher, env={}, cpus=16, gpus=0)["OMP_NUM_THREADS"] == "8"
    assert rank_environment(launcher, env={}, cpus=3, gpus=0)["OMP_NUM_THREADS"] == "1"
    assert rank_environment(launcher, env={"OMP_NUM_THREADS": "3"}, cpus=16, gpus=0)["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in rank_environment(launcher, env={}, cpus=16, gpus=2)  # torchrun's 1 per GPU rank


def test_a_rank_that_fails_ends_the_run_in_one_line_with_its_exit_code(tmp_path):
    # Each rank refuses a config that is not there (Gym's one-line error, exit 2); the launcher then says which
    # rank stopped the run, in place of torchrun's traceback and failure table, and leaves with the rank's code.
    command = torchrun_command(["train", str(tmp_path / "missing.yaml")],
                               env={"NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port())})
    assert command is not None and command[1:3] == ["-m", "gym.workflows.torchrun"]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr, done.stderr[-3000:]
    assert "missing.yaml" in done.stderr
    assert re.search(r"gym: the run stopped: rank [01] exited with code 2; its message is above\.", done.stderr)


def test_a_rank_killed_by_a_signal_is_named_with_the_shells_exit_code():
    from gym.workflows.torchrun import failure_line

    line, code = failure_line(1, -9)
    assert code == 137 and "rank 1 was killed by SIGKILL" in line and "out-of-memory" in line
    assert failure_line(0, -15) == ("gym: the run stopped: rank 0 was killed by SIGTERM.", 143)


@pytest.mark.slow
def test_ctrl_c_under_torchrun_stops_every_rank_after_the_same_step_with_a_checkpoint(train_config, tmp_path):
    # As from a terminal: SIGINT to the whole foreground group (gym, torchrun), not ignored. The ranks lead their
    # own sessions and hear it from the launcher; they finish the step, decide together, save and leave with 130.
    import signal
    import time

    config = _config(train_config, tmp_path, "stopped", per_device=2, max_steps=10_000, save_strategy="no",
                     logging_steps=1)
    path = tmp_path / "stopped.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.Popen([sys.executable, "-m", "gym.cli", "train", str(path)],
                           env={**os.environ, "OMP_NUM_THREADS": "1", "NPROC_PER_NODE": "2"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = tmp_path / "stopped" / "trainer_log.jsonl"
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline and not (
            log.is_file() and log.read_text().count('"loss"') >= 2):
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGINT)
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 130, out[-3000:]
    stopped = re.findall(r"gym: stopped at step (\d+) of 10000 on request", out)
    assert len(stopped) == 1, out[-3000:]  # said once, by rank 0
    checkpoint = tmp_path / "stopped" / f"checkpoint-{stopped[0]}"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "rng_state_1.pth").is_file()  # rank 1 stopped at that step too, and saved its state
    assert len(list((tmp_path / "stopped").glob("checkpoint-*"))) == 1
    assert "Traceback" not in out and "interrupted" not in out, out[-3000:]
