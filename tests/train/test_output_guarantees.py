"""What `gym train` promises about its output folder: one live run owns it, a finished run is never
trained again by a resume, a full disk leaves no half-written checkpoint, and what a killed run left is
cleaned up by the next run."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.gym_cli import gym_process

from gym.core.errors import ConfigError, OutputError
from gym.core.files import LOCK_FILE, OutputLock
from gym.workflows.training import run_exp


def test_a_second_run_on_a_live_runs_output_fails_at_once_naming_the_owner(train_config, tmp_path):
    config = train_config()
    with OutputLock(config["output_dir"], what="gym train"):
        started = time.perf_counter()
        with pytest.raises(OutputError, match=rf"in use by another Gym process \(gym train, pid {os.getpid()} on "):
            run_exp(config)
        assert time.perf_counter() - started < 30  # refused before any model loads
    result = run_exp(config)  # released: the folder is free again
    assert result.global_step == 3 and not (Path(config["output_dir"]) / LOCK_FILE).exists()


def test_two_processes_training_into_one_folder_cannot_mix(train_config, tmp_path):
    """A real `gym train` owns the folder while it runs (long enough to be caught running); a second one exits 2
    at once naming it, and writes nothing into the first run's log."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(train_config(max_steps=100_000, save_strategy="no")))
    gym = [sys.executable, "-m", "gym.cli", "train", str(config)]
    first = subprocess.Popen(gym, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = Path(train_config()["output_dir"])
    try:
        deadline = time.time() + 180
        while not (out / "trainer_log.jsonl").is_file() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)  # the first run is training (its log exists) and holds the lock
        assert first.poll() is None, first.communicate()[1][-2000:]
        lines_before = (out / "trainer_log.jsonl").read_text().count("\n")
        second = subprocess.run(gym, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"pid {first.pid}" in second.stderr and second.stderr.count("gym: error:") == 1
        steps = [json.loads(line)["step"] for line in (out / "trainer_log.jsonl").read_text().splitlines()]
        assert steps == sorted(steps) and len(steps) >= lines_before  # one run's log, still growing, not reset
    finally:
        first.kill()
        first.communicate()


def test_a_stale_lock_of_a_dead_process_is_replaced(train_config):
    config = train_config()
    out = Path(config["output_dir"])
    out.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    import socket

    (out / LOCK_FILE).write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "since": "then"}))
    assert run_exp(config).global_step == 3


def test_resuming_a_finished_run_trains_nothing(train_config, capsys):
    from gym.cli import main

    config = train_config(save_strategy="steps", save_steps=1)
    first = run_exp(config)
    log = (Path(first.output_dir) / "trainer_log.jsonl").read_text()
    weights = (Path(first.output_dir) / "adapter_model.safetensors").read_bytes()
    again = run_exp({**config, "resume_from_checkpoint": True})
    assert again.global_step == 3 and again.metrics["already_complete"]
    assert (Path(first.output_dir) / "trainer_log.jsonl").read_text() == log
    assert (Path(first.output_dir) / "adapter_model.safetensors").read_bytes() == weights
    cfg = Path(first.output_dir).parent / "resume.yaml"
    cfg.write_text(yaml.safe_dump({**config, "resume_from_checkpoint": True}))
    assert main(["train", str(cfg)]) == 0
    assert "Already complete" in capsys.readouterr().out
    more = run_exp({**config, "resume_from_checkpoint": True, "max_steps": 5})  # asked for more: it continues
    assert more.global_step == 5 and not more.metrics.get("already_complete")


def _disk_full_at_step_two(monkeypatch, written: str, error: Exception):
    """transformers' checkpoint save fails at step 2 after writing `written` (no trainer_state.json); the real save
    is given back by the returned function."""
    import transformers

    real_save = transformers.Trainer._save_checkpoint

    def save(self, model, trial):
        if self.state.global_step < 2:
            return real_save(self, model, trial)
        partial = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        partial.mkdir(parents=True)
        (partial / written).write_bytes(b"\0" * 1000)
        raise error

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", save)
    return lambda: monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", real_save)


@pytest.mark.parametrize("written, error", [
    ("optimizer.pt", OSError(errno.ENOSPC, "No space left on device", "optimizer.pt")),
    # tokenizers raises its own Exception, not an OSError, while a checkpoint's tokenizer is saved: it was a
    # traceback, and the half-written checkpoint stayed
    ("adapter_model.safetensors", Exception("No space left on device (os error 28)")),
])
def test_a_full_disk_while_checkpointing_leaves_no_partial_checkpoint(written, error, train_config, monkeypatch):
    space_is_back = _disk_full_at_step_two(monkeypatch, written, error)
    config = train_config(save_strategy="steps", save_steps=1)
    with pytest.raises(OutputError, match=r"No space left on the device of .* free after removing the partial"):
        run_exp(config)
    out = Path(config["output_dir"])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert not list(out.glob(".*.tmp-*")) and not (out / LOCK_FILE).exists()
    space_is_back()
    resumed = run_exp({**config, "resume_from_checkpoint": True})  # it resumes from step 1
    assert resumed.global_step == 3


def test_what_a_killed_run_left_is_removed_by_the_next(train_config):
    config = train_config()
    out = Path(config["output_dir"])
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    (out / f".final.tmp-{dead}").mkdir(parents=True)
    (out / f".final.tmp-{dead}" / "model.safetensors").write_bytes(b"\0" * 100)
    half = out / "checkpoint-7"
    half.mkdir()
    (half / "optimizer.pt").write_bytes(b"\0")
    run_exp(config)
    assert not (out / f".final.tmp-{dead}").exists() and not half.exists()


@pytest.mark.parametrize("problem", ["file", "unwritable"])
def test_an_output_dir_that_cannot_be_written_is_one_line(train_config, tmp_path, problem):
    target = tmp_path / "target"
    if problem == "file":
        target.write_text("not a folder")
        out, fragment = target, "is a file"
    else:  # sysfs refuses new folders even to root (EPERM), as a read-only mount would (EROFS)
        out, fragment = Path("/sys/gym-cannot-write-here"), "Permission denied (/sys/gym-cannot-write-here)"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(train_config(output_dir=str(out))))
    proc = gym_process("train", config)
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("what", "damage"), [
    ("empty tensors", lambda v: v.new_empty(0)),  # ZeRO-3 saving its placeholders, ungathered
    ("tensors of the wrong shape", lambda v: v[: max(1, v.shape[0] // 2)].clone()),  # one rank's FSDP shard
])
def test_an_adapter_saved_ungathered_is_an_error_not_a_silent_file(what, damage, train_config, monkeypatch):
    """What a sharded run that saves without gathering writes: placeholders with no elements, or a shard."""
    from peft import PeftModel
    from safetensors.torch import save_file

    from gym.core.errors import OutputError

    real_save = PeftModel.save_pretrained

    def save_unshared(self, folder, *args, **kwargs):
        real_save(self, folder, *args, **kwargs)
        from safetensors.torch import load_file

        path = Path(folder) / "adapter_model.safetensors"
        save_file({k: damage(v) for k, v in load_file(str(path)).items()}, str(path))

    monkeypatch.setattr(PeftModel, "save_pretrained", save_unshared)
    config = train_config()
    with pytest.raises(OutputError, match=what):
        run_exp(config)
    assert not (Path(config["output_dir"]) / "gym_manifest.json").exists()


def test_a_runs_saved_config_reads_back_as_the_config_it_ran(trained_run, tmp_path):
    """gym_config.yaml is the config as run: `gym train saves/run/gym_config.yaml output_dir=...` reruns it. What it
    records only for its reader (the folder the base resolved to) is not a setting, and a hidden credential is none."""
    from gym.config.files import parse_cli_args
    from gym.config.parser import get_train_args

    saved = yaml.safe_load((trained_run / "gym_config.yaml").read_text())
    assert "resolved_model_path" in saved
    (tmp_path / "again.yaml").write_text(yaml.safe_dump({**saved, "hub_token": "<hidden>"}))
    args = get_train_args(parse_cli_args([str(tmp_path / "again.yaml"), f"output_dir={tmp_path / 'again'}"]))
    assert (args.data.template, args.data.default_system, args.generating.temperature) == ("llama3", "Answer briefly.",
                                                                                          0.3)
    assert args.finetuning.lora_rank == saved["lora_rank"] and args.model.model_name_or_path == saved[
        "model_name_or_path"]
    assert args.training.hub_token is None


def test_a_runs_weights_are_readable_as_the_umask_says(trained_run):
    """safetensors writes 0600; the run's folder is shared as its config and tokenizer are (core.files)."""
    mask = os.umask(0)
    os.umask(mask)
    weights = list(trained_run.glob("*.safetensors"))
    assert weights and all(w.stat().st_mode & 0o666 & ~mask == 0o666 & ~mask for w in weights)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_of_the_users_own_files_is_never_trained_into(train_config, tmp_path, overwrite):
    # The run's model card replaced the user's README.md, with exit 0, overwrite_output_dir or not.
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("my precious notes")
    (folder / "data.txt").write_text("keep")
    with pytest.raises(OutputError, match=r"holds README.md and 1 more, which no Gym run wrote"):
        run_exp(train_config(output_dir=str(folder), overwrite_output_dir=overwrite))
    assert (folder / "README.md").read_text() == "my precious notes"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "data.txt"]


def test_what_a_run_cut_short_left_is_resumed_not_refused(train_config, tmp_path):
    folder = tmp_path / "cut"
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / "trainer_log.jsonl").write_text("")
    from gym.train.installing import _not_a_run

    assert _not_a_run(folder) == []


def test_a_lock_appears_whole_and_a_folder_in_its_place_is_one_line(tmp_path, monkeypatch):
    # Created empty and then written, a lock read in between looked stale and was taken from a live run.
    seen: list[str] = []
    real_link = os.link

    def watching_link(source, target):
        real_link(source, target)
        seen.append(Path(target).read_text())  # what another process would read the moment the lock exists

    monkeypatch.setattr(os, "link", watching_link)
    with OutputLock(tmp_path / "run", what="gym train"):
        assert json.loads(seen[0])["pid"] == os.getpid()
    (tmp_path / "other" / LOCK_FILE).mkdir(parents=True)
    with pytest.raises(OutputError, match=r"is a folder, where Gym keeps its lock file; remove it"):
        OutputLock(tmp_path / "other").acquire()


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_a_kill_while_installing_the_result_resumes_to_the_same_model_without_an_extra_step(train_config,
                                                                                             monkeypatch):
    # The result's files were renamed in one by one, the manifest whenever the folder listing put it: a kill between
    # renames left a folder marked finished without its config, or one refused as "files no Gym run wrote". And
    # resuming the checkpoint at max_steps trained a fourth step of three.
    import gym.train.installing as installing
    import gym.train.outputs as outputs

    config = train_config(save_strategy="steps", save_steps=1)
    out = Path(config["output_dir"])
    real_replace, installed = os.replace, []

    def killed_at_the_third_file(source, target):
        if Path(target).parent == out and not Path(source).name.startswith(".gym-final"):
            installed.append(Path(target).name)
            if len(installed) == 3:
                raise KeyboardInterrupt
        return real_replace(source, target)

    monkeypatch.setattr(installing.os, "replace", killed_at_the_third_file)
    with pytest.raises(KeyboardInterrupt):
        run_exp(config)
    monkeypatch.setattr(installing.os, "replace", real_replace)
    assert not (out / "gym_manifest.json").exists() and "gym_manifest.json" not in installed
    with pytest.raises(ConfigError, match="checkpoint-3 of a run cut short. Set resume_from_checkpoint: true"):
        run_exp(config)  # a fresh run would mix its checkpoints with these

    resumed = run_exp({**config, "resume_from_checkpoint": True})
    assert resumed.global_step == 3
    assert [e["step"] for e in outputs.read_log(out) if "loss" in e] == [1, 2, 3]
    final = _tensors(out / "adapter_model.safetensors")
    last = _tensors(out / "checkpoint-3" / "adapter_model.safetensors")
    assert final.keys() == last.keys() and all(final[k].equal(last[k]) for k in final)
    manifest = json.loads((out / "gym_manifest.json").read_text())
    assert {"gym_config.yaml", "adapter_model.safetensors"} <= set(manifest["files"])
    assert not (out / installing.FINAL_JOURNAL).exists()
    mask = os.umask(0)
    os.umask(mask)
    saved = out / "checkpoint-1" / "adapter_model.safetensors"  # safetensors writes 0600
    assert saved.stat().st_mode & 0o666 & ~mask == 0o666 & ~mask


def test_overwrite_output_dir_starts_again_leaving_nothing_of_the_earlier_run(train_config):
    # The earlier run's checkpoints stayed, so a later resume continued it; its model's files stayed beside the new.
    from gym.train.checkpoints import last_checkpoint

    first = train_config(finetuning_type="full", max_steps=4, save_strategy="steps", save_steps=1)
    out = Path(run_exp(first).output_dir)
    assert (out / "model.safetensors").is_file() and last_checkpoint(out).name == "checkpoint-4"
    again = {**first, "finetuning_type": "lora", "max_steps": 2, "overwrite_output_dir": True}
    assert run_exp(again).global_step == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert not (out / "model.safetensors").exists() and (out / "adapter_model.safetensors").is_file()
    resumed = run_exp({**again, "overwrite_output_dir": False, "resume_from_checkpoint": True})
    assert resumed.metrics["already_complete"] and resumed.global_step == 2


def test_an_overwritten_run_cut_short_is_not_read_as_the_earlier_finished_one(train_config):
    from gym.train.installing import _not_a_run, start_over
    from gym.train.outputs import completed_run

    out = Path(run_exp(train_config()).output_dir)
    (out / "checkpoint-3").mkdir()
    assert start_over(out) == ["checkpoint-3", "gym_manifest.json"]
    # Killed before its own result: not "already complete" with the earlier model, and its files are Gym's.
    from gym.config.parser import get_train_args

    assert completed_run(get_train_args(train_config(resume_from_checkpoint=True)), resuming=True) is None
    assert _not_a_run(out) == []


def test_training_into_the_model_it_starts_from_is_refused(train_config, tiny_model_dir):
    with pytest.raises(OutputError, match=r"is the input .*overwrite_output_dir or not"):
        run_exp(train_config(output_dir=str(tiny_model_dir), overwrite_output_dir=True))
    assert (tiny_model_dir / "config.json").is_file()


def test_installing_a_result_replaces_a_file_with_a_folder_and_lists_what_it_wrote(tmp_path):
    from gym.core.files import write_manifest
    from gym.train.installing import FINAL_JOURNAL, install_final

    out, tmp = tmp_path / "out", tmp_path / "out" / ".final.tmp-1"
    (tmp / "value_head").mkdir(parents=True)
    (tmp / "value_head" / "weights.bin").write_text("new")
    write_manifest(tmp, {"what": "model"})
    (out / "value_head").write_text("an earlier run's file")
    install_final(tmp, out)
    assert (out / "value_head" / "weights.bin").read_text() == "new"
    assert json.loads((out / "gym_manifest.json").read_text())["files"] == ["value_head/weights.bin"]
    assert not (out / FINAL_JOURNAL).exists() and sorted(p.name for p in tmp.iterdir()) == []
