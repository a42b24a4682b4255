"""The job store: a job is a `gym` subprocess whose state is on disk, so another store (a restarted server, a
reloaded page) finds it; Stop is SIGINT (a training run saves a checkpoint and exits 130); uploads cannot escape
the job's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import gym.webui.jobs as jobs
from gym.webui.jobs import JobStore, sanitize_name


def test_a_job_runs_and_its_state_is_read_back_by_another_store(tmp_path):
    store = JobStore(tmp_path / "runs")
    job = store.start(store.create("train", "version", ["version"]))
    assert store.wait(job, timeout=120) == 0
    again = JobStore(tmp_path / "runs").get(job.id)  # a fresh store: nothing in memory
    assert again.status == "finished" and again.command == "gym version"
    assert again.console().strip().splitlines()[-1][0].isdigit()
    assert [j.id for j in JobStore(tmp_path / "runs").list("train")] == [job.id]


def test_a_failing_command_is_failed_with_its_message(tmp_path):
    store = JobStore(tmp_path / "runs")
    job = store.start(store.create("train", "bad", ["train", "{config}"], config={"stage": "sft", "lerning_rate": 1}))
    assert store.wait(job, timeout=120) == 2
    job = store.get(job.id)
    assert job.status == "failed" and "did you mean 'learning_rate'" in job.console().lower()


def test_the_supervisor_runs_the_command_as_last_set_even_when_the_server_is_slow(tmp_path, monkeypatch):
    """The supervisor reads the command from job.json, so start saves it first: here the server gets the CPU back
    only after the supervisor has ended (a loaded machine), and the changed command and a Resume's extra argument
    still reach the process (saved after Popen, the supervisor ran the job's previous command)."""
    real_popen = subprocess.Popen

    def slow_server(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        proc.wait()
        return proc

    monkeypatch.setattr(jobs.subprocess, "Popen", slow_server)
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "t", ["version"])
    seen = tmp_path / "seen"
    job.argv = [sys.executable, "-c",
                f"import pathlib, sys; pathlib.Path({str(seen)!r}).write_text(repr(sys.argv[1:]))"]
    assert store.wait(store.start(job), timeout=120) == 0 and seen.read_text() == "[]"
    assert store.wait(store.restart(store.get(job.id), ["resume_from_checkpoint=true"]), timeout=120) == 0
    assert seen.read_text() == "['resume_from_checkpoint=true']"


@pytest.mark.slow
def test_stop_saves_a_checkpoint_and_resume_finishes_the_run(tmp_path, train_config):
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "long", ["train", "{config}"], output="{job}/output")
    store.write_config(job, train_config(max_steps=100_000, logging_steps=1, output_dir=job.output))
    store.start(job)
    log = tmp_path / "runs" / job.id / "output" / "trainer_log.jsonl"
    deadline = time.time() + 180
    while not (log.is_file() and len(log.read_text().splitlines()) >= 2) and time.time() < deadline:
        time.sleep(0.2)
    assert store.get(job.id).status == "running"
    store.stop(store.get(job.id))
    assert store.wait(job, timeout=120) == 130
    stopped = store.get(job.id)
    assert stopped.status == "stopped" and "resume_from_checkpoint=true" in stopped.console()
    checkpoint = max((tmp_path / "runs" / job.id / "output").glob("checkpoint-*"), key=lambda p: int(p.name[11:]))
    step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]

    # Resume, to a near end: the same folder, the same YAML, resume_from_checkpoint=true added.
    store.write_config(job, train_config(max_steps=step + 2, logging_steps=1, output_dir=job.output))
    resumed = store.restart(stopped, ["resume_from_checkpoint=true"])
    assert resumed.argv[-1] == "resume_from_checkpoint=true"
    assert store.wait(resumed, timeout=180) == 0
    manifest = json.loads((tmp_path / "runs" / job.id / "output" / "gym_manifest.json").read_text())
    assert manifest["global_step"] == step + 2


def test_a_job_whose_supervisor_died_is_lost_not_running(tmp_path):
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "ghost", ["version"])
    job.pid = 2**22 + 12345  # no such process
    store._save(job)
    assert JobStore(tmp_path / "runs").get(job.id).status == "lost"


@pytest.mark.parametrize("name, expected", [
    ("../../etc/passwd", "passwd"), ("..\\..\\boot.ini", "boot.ini"), (".hidden.json", "hidden.json"),
    ("my rows (1).jsonl", "my_rows_1_.jsonl"), ("", "upload"), ("/", "upload"),
])
def test_uploaded_names_are_sanitized(name, expected):
    assert sanitize_name(name) == expected


def test_an_upload_lands_in_the_jobs_uploads_folder(tmp_path):
    store = JobStore(tmp_path / "runs")
    job = store.create("delta", "variant", ["version"])
    source = tmp_path / "rows.json"
    source.write_text("[]")
    stored = store.upload(job, source, "../../../escape.json")
    assert stored == job.folder / "uploads" / "escape.json" and stored.read_text() == "[]"
    assert not (tmp_path / "escape.json").exists()


def test_unknown_job_ids_are_refused(tmp_path):
    from gym.core.errors import GymError

    store = JobStore(tmp_path / "runs")
    for bad in ("nope", "../x", ""):
        with pytest.raises(GymError):
            store.get(bad)
    assert os.listdir(tmp_path / "runs") == []
