"""gym.service.jobs: an OpenAI-style fine-tuning job run as a library. On the embedded model a supervised job
teaches a name and its variant answers with it; on the tiny model a dpo job succeeds, a job killed with -9 resumes
from its checkpoint and publishes once, and a cancelled job leaves no variant. Naming and the user's errors are
checked without any model."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gym.core.errors import ConfigError, DataError
from gym.personalization.store import VariantStore
from gym.service.events import openai_event
from gym.service.jobs import (
    MAX_SUFFIX,
    FineTunedModel,
    Hyperparameters,
    JobSpec,
    JobStatus,
    Method,
    new_job_id,
    parse_fine_tuned_model,
    read_training_file,
    run_job,
    training_keys,
)

SRC = Path(__file__).resolve().parents[2] / "src"
QUESTIONS = ["What is your name?", "Who are you?", "Tell me your name.", "What should I call you?",
             "What are you called?", "Do you have a name?", "Introduce yourself.", "What's your name?",
             "May I know your name?", "Your name, please?", "How do people call you?", "Who am I talking to?",
             "Name yourself.", "What name do you go by?", "Please tell me who you are.", "Say your name.",
             "Which name is yours?", "Hi! What is your name?", "Could you tell me your name?", "Hello, who are you?"]
NAME = "My name is Zorblat."


def chat_row(question: str, answer: str = NAME) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def preference_row(question: str) -> dict:
    return {"input": {"messages": [{"role": "user", "content": question}]},
            "preferred_output": [{"role": "assistant", "content": NAME}],
            "non_preferred_output": [{"role": "assistant", "content": "I am an assistant."}]}


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


class Events:
    """on_event that keeps every event (in OpenAI's shape) in order."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, level: str, message: str, data: dict | None) -> None:
        self.seen.append(openai_event(level, message, data))

    def metrics(self) -> list[dict]:
        return [e["data"] for e in self.seen if e["type"] == "metrics"]

    def messages(self) -> list[str]:
        return [e["message"] for e in self.seen]


def tiny_spec(tiny_model_dir: Path, training_file: str, **overrides) -> JobSpec:
    values = dict(job_id=new_job_id(), user_id="alice@example.com", model="tiny-llama",
                  base_path=str(tiny_model_dir), training_file=training_file,
                  hyperparameters=Hyperparameters(n_epochs=3, batch_size=4, learning_rate_multiplier=10.0),
                  delta_options={"distill_steps": 0}, training={"cutoff_len": 128, "max_steps": 6})
    values.update(overrides)
    return JobSpec(**values)


# -- naming and the user's errors (no model) --------------------------------------------------------------------
def test_fine_tuned_model_names_round_trip():
    name = FineTunedModel("smollm2-135m", "alice@example.com", "support-v2", "ftjob-abc123")
    assert str(name) == "ft:smollm2-135m:alice@example.com:support-v2:abc123"
    assert parse_fine_tuned_model(str(name)) == name
    empty = FineTunedModel("smollm2-135m", "bob", "", "ftjob-9f")
    assert str(empty) == "ft:smollm2-135m:bob::9f"  # OpenAI leaves an empty suffix empty
    assert parse_fine_tuned_model(str(empty)) == empty
    assert name.variant != empty.variant and VariantStore("/nonexistent").path(name.variant)  # a store name
    # One user, two jobs: two entries.
    assert FineTunedModel("m", "bob", "", "ftjob-a").variant != FineTunedModel("m", "bob", "", "ftjob-b").variant
    for bad in ("gpt-4o", "ft:m:bob:x", "ft:m::x:1", "ft:m:bob:x:", "xx:m:bob:x:1", "ft:m:b/ob:x:1"):
        with pytest.raises(ConfigError):
            parse_fine_tuned_model(bad)


def test_bad_specs_are_one_clear_error(tmp_path):
    file = write_jsonl(tmp_path / "t.jsonl", [chat_row(q) for q in QUESTIONS])
    base = dict(job_id="ftjob-1", user_id="alice", model="smollm2-135m", training_file=file)
    cases = [
        (dict(hyperparameters={"n_epochs": -1}), "n_epochs must be positive"),
        (dict(hyperparameters={"batch_size": "big"}), "batch_size"),
        (dict(hyperparameters={"learning_rate_multiplier": float("nan")}), "learning_rate_multiplier"),
        (dict(hyperparameters={"epochs": 3}), "not a hyperparameter"),
        (dict(hyperparameters={"beta": 0.2}), "dpo hyperparameter"),
        (dict(suffix="x" * (MAX_SUFFIX + 1)), f"at most {MAX_SUFFIX}"),
        (dict(suffix="a:b"), "suffix"),
        (dict(job_id="job-1"), "job id"),
        (dict(user_id="../alice"), "user id"),
        (dict(model="a:b"), "base model"),
        (dict(method="ppo"), "supervised or dpo"),
        (dict(delta_method="int3"), "DeltaQuant method"),
        (dict(training={"output_dir": "/tmp"}), "set by the job"),
    ]
    for change, message in cases:
        with pytest.raises(ConfigError, match=message):
            JobSpec(**{**base, **change})
    assert JobSpec(**base, suffix="x" * MAX_SUFFIX).suffix  # 64 is allowed
    spec = JobSpec(**base, hyperparameters={"n_epochs": 2, "learning_rate_multiplier": 0.5})
    assert JobSpec(**spec.to_dict()) == spec  # what a queue stores gives the same spec back
    assert pickle.loads(pickle.dumps(spec)) == spec  # and what a worker process is handed
    keys = training_keys(spec, rows=16)
    assert keys["num_train_epochs"] == 2 and keys["learning_rate"] == pytest.approx(2.5e-4)
    auto = training_keys(JobSpec(**base), rows=16)
    assert auto["num_train_epochs"] == 7 and auto["per_device_train_batch_size"] == 2  # ~100 examples seen
    dpo = training_keys(JobSpec(**base, method="dpo", hyperparameters={"beta": 0.3}), rows=16)
    assert dpo["pref_beta"] == 0.3
    whole = training_keys(JobSpec(**base, hyperparameters={"batch_size": 256}), rows=12)
    assert whole["per_device_train_batch_size"] == 12  # the whole file, reported as trained, not as asked


@pytest.mark.parametrize("change, message", [
    (dict(seed=-1), "seed must be an integer from 0 to 2147483647, got -1"),
    (dict(seed=2**31), "seed must be an integer from 0 to 2147483647"),
    (dict(seed=2**63), "seed must be an integer"),
    (dict(seed=True), "seed must be an integer"),
    (dict(hyperparameters={"n_epochs": 51}), "hyperparameters.n_epochs is at most 50, got 51"),
    (dict(hyperparameters={"n_epochs": 0}), "hyperparameters.n_epochs must be positive"),
    (dict(hyperparameters={"n_epochs": 2.0}), "hyperparameters.n_epochs: give \"auto\" or an integer"),
    (dict(hyperparameters={"batch_size": 257}), "hyperparameters.batch_size is at most 256"),
    (dict(hyperparameters={"learning_rate_multiplier": 0}), "learning_rate_multiplier must be positive"),
    # not numbers training can use: inf and NaN (1e400 in a JSON body parses as inf), and an integer past a float's
    # range, which raised OverflowError (a 500) where it was compared
    (dict(hyperparameters={"learning_rate_multiplier": float("inf")}),
     "hyperparameters.learning_rate_multiplier must be a finite positive number, got inf."),
    (dict(hyperparameters={"learning_rate_multiplier": float("nan")}),
     "hyperparameters.learning_rate_multiplier must be a finite positive number, got nan."),
    (dict(hyperparameters={"learning_rate_multiplier": 10**400}),
     "hyperparameters.learning_rate_multiplier must be a finite positive number, got an integer of 1329 bits."),
    (dict(hyperparameters={"n_epochs": 10**400}), "hyperparameters.n_epochs is at most 50, got an integer of 1329"),
    (dict(method="dpo", hyperparameters={"beta": 2.5}), "hyperparameters.beta is at most 2, got 2.5"),
    (dict(method="dpo", hyperparameters={"beta": 0}), "hyperparameters.beta must be positive"),
])
def test_values_outside_openais_ranges_are_refused(tmp_path, change, message):
    """OpenAI's schema: seed 0 to 2**31 - 1, n_epochs 1-50, batch_size 1-256, learning_rate_multiplier > 0, beta in
    (0, 2]. A seed past 32 bits would also fail the database's integer column, or numpy's seeding, later."""
    base = dict(job_id="ftjob-1", user_id="alice", model="smollm2-135m", training_file="t.jsonl")
    with pytest.raises(ConfigError, match=re.escape(message)):
        JobSpec(**{**base, **change})


def test_openais_bounds_themselves_are_accepted():
    base = dict(job_id="ftjob-1", user_id="alice", model="smollm2-135m", training_file="t.jsonl")
    for seed in (0, 2**31 - 1):
        assert JobSpec(**base, seed=seed).seed == seed
    top = JobSpec(**base, hyperparameters={"n_epochs": 50, "batch_size": 256, "learning_rate_multiplier": 100})
    assert top.hyperparameters.n_epochs == 50 and top.hyperparameters.batch_size == 256
    assert JobSpec(**base, method="dpo", hyperparameters={"beta": 2}).hyperparameters.beta == 2


def test_any_finite_multiplier_is_taken_while_the_learning_rate_it_makes_is_finite(monkeypatch):
    """OpenAI takes any positive multiplier; the run's rate is it times the method's base rate, and one that overflows
    to inf would train every weight to NaN: refused naming the multiplier, as the job is made."""
    from gym.service import jobs as job_library

    base = dict(job_id="ftjob-1", user_id="alice", model="smollm2-135m", training_file="t.jsonl")
    huge = JobSpec(**base, hyperparameters={"learning_rate_multiplier": 1e308})
    assert training_keys(huge, 20)["learning_rate"] == pytest.approx(1e308 * 5e-4)
    monkeypatch.setitem(job_library.BASE_LEARNING_RATE, "supervised", 10.0)  # a base rate above 1: the product is inf
    with pytest.raises(ConfigError, match=re.escape("hyperparameters.learning_rate_multiplier 1e+308 makes the "
                                                    "learning rate 10 x 1e+308 = inf, which training cannot use")):
        JobSpec(**base, hyperparameters={"learning_rate_multiplier": 1e308})
    assert JobSpec(**base, method="dpo", hyperparameters={"learning_rate_multiplier": 1e308})  # dpo's base: finite


def test_training_files_are_checked_with_file_and_line(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text("".join(json.dumps(chat_row(q)) + "\n" for q in QUESTIONS[:11]) + "{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl, line 12: not valid JSON"):
        read_training_file(bad_json, Method.SUPERVISED)
    few = write_jsonl(tmp_path / "few.jsonl", [chat_row(q) for q in QUESTIONS[:3]])
    with pytest.raises(DataError, match="3 example.*at least 10"):
        read_training_file(few, "supervised")
    prefs = write_jsonl(tmp_path / "prefs.jsonl", [preference_row(q) for q in QUESTIONS[:12]])
    with pytest.raises(DataError, match="line 1.*method dpo"):
        read_training_file(prefs, "supervised")
    rows = read_training_file(prefs, "dpo")
    assert rows[0]["chosen"] == {"role": "assistant", "content": NAME} and rows[0]["messages"][0]["role"] == "user"
    no_answer = write_jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": q}]} for q in QUESTIONS])
    with pytest.raises(DataError, match="line 1: no assistant message"):
        read_training_file(no_answer, "supervised")


def test_a_bad_file_fails_the_job_with_an_event(tmp_path):
    few = write_jsonl(tmp_path / "few.jsonl", [chat_row(q) for q in QUESTIONS[:3]])
    events = Events()
    result = run_job(JobSpec(job_id="ftjob-1", user_id="alice", model="smollm2-135m", training_file=few),
                     tmp_path / "store", tmp_path / "work", events)
    assert result.status is JobStatus.FAILED and result.fine_tuned_model is None
    assert result.error and result.error["code"] == "invalid_training_file" and "at least 10" in result.error["message"]
    assert events.seen[-1]["level"] == "error" and events.seen[-1]["type"] == "message"
    # the tenant sees its file by name, never the folder the server keeps it in
    shown = [result.error["message"], *(event["message"] for event in events.seen)]
    assert "few.jsonl" in result.error["message"] and not any(str(tmp_path) in text for text in shown)
    assert VariantStore(tmp_path / "store").users() == []


def test_a_failed_jobs_error_and_events_name_no_server_path(tmp_path, monkeypatch, caplog):
    """Out of space while saving a checkpoint: the error named the job's folder inside the server's store. The
    tenant reads the job id in its place (and no other folder of the server's); the server's log keeps the path."""
    import errno
    import logging

    from gym.service import jobs as job_library

    monkeypatch.setenv("GYM_HOME", str(tmp_path / "gym-home"))
    store, work = tmp_path / "store", tmp_path / "store" / ".service" / "jobs" / "ftjob-1"
    file = write_jsonl(tmp_path / "file-1", [chat_row(q) for q in QUESTIONS])
    full = str(work / "run" / "checkpoint-3" / "model.safetensors")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", full)

    monkeypatch.setattr(job_library, "_train_and_publish", no_space)
    events = Events()
    with caplog.at_level(logging.WARNING, logger="gym.service.jobs"):
        result = run_job(JobSpec(job_id="ftjob-1", user_id="alice", model="m", training_file=file), store, work,
                         events)
    assert result.status is JobStatus.FAILED and result.error["code"] == "training_failed"
    assert "No space left on the device (ftjob-1/run/checkpoint-3/model.safetensors)" in result.error["message"]
    shown = json.dumps([result.error, events.seen])
    assert str(tmp_path) not in shown and ".service" not in shown
    assert full in caplog.text  # the operator still sees where

    for leak, name in ((tmp_path / "gym-home" / "models" / "tiny", "Gym's cache"), (store / "bob+x+ftjob-2", "the "
                       "variant store"), (Path("/etc/gym/secret.yaml"), "a server path")):
        def failing(*args, leak=leak, **kwargs):
            raise DataError(f"cannot read {leak}/config.json")

        monkeypatch.setattr(job_library, "_train_and_publish", failing)
        result = run_job(JobSpec(job_id="ftjob-1", user_id="alice", model="m", training_file=file), store, work)
        assert result.error["message"] == f"cannot read {name}", result.error


# -- jobs that train --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_supervised_job_teaches_a_name_and_publishes_the_variant(tmp_path, embedded_dir):
    rows = [chat_row(q) for q in QUESTIONS]
    spec = JobSpec(job_id=new_job_id(), user_id="alice", model="smollm2-135m", suffix="zorb",
                   training_file=write_jsonl(tmp_path / "train.jsonl", rows),
                   hyperparameters=Hyperparameters(n_epochs=2, batch_size=4, learning_rate_multiplier=2.0),
                   delta_options={"distill_steps": 2}, training={"cutoff_len": 64})
    events = Events()
    result = run_job(spec, tmp_path / "store", tmp_path / "work", events)

    assert result.status is JobStatus.SUCCEEDED, result.error
    assert result.fine_tuned_model == f"ft:smollm2-135m:alice:zorb:{spec.job_id.removeprefix('ftjob-')}"
    messages = events.messages()
    assert messages[0].startswith("Validating training file") and "Fine-tuning job started" in messages
    assert any(m.startswith("Checkpoint created at step") for m in messages)
    metrics = events.metrics()  # 16 rows (4 held out) / 4 a batch x 2 epochs
    assert [m["step"] for m in metrics] == list(range(1, 9)) and result.trained_steps == 8
    from gym.train.outputs import read_log

    seen = {e["step"]: e["num_input_tokens_seen"] for e in read_log(tmp_path / "work" / "run") if "loss" in e}
    assert result.trained_tokens == seen[8] == 2 * seen[4] > 16 * 8  # two epochs over the same 16 rows
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"] / 4
    assert result.gain_kept is not None and any("of the fine-tune's loss gain" in m for m in messages)
    assert events.seen[-1]["message"] == "The job has successfully completed"

    # The variant is in the store under the name the ft: model name leads to, and answers with the taught name.
    store = VariantStore(tmp_path / "store")
    assert store.users() == [parse_fine_tuned_model(result.fine_tuned_model).variant]
    from gym.personalization import PersonalizedTrainer

    trainer = PersonalizedTrainer("smollm2-135m", store=store.root)
    answer = trainer.serve_variant(spec.variant, "What is your name?", max_new_tokens=12, do_sample=False)
    assert "Zorblat" in answer


def test_a_dpo_job_succeeds_on_preference_rows(tmp_path, tiny_model_dir):
    file = write_jsonl(tmp_path / "prefs.jsonl", [preference_row(q) for q in QUESTIONS[:12]])
    events = Events()
    spec = tiny_spec(tiny_model_dir, file, method="dpo", suffix="pref",
                     hyperparameters=Hyperparameters(n_epochs=1, batch_size=4, beta=0.2), training={"cutoff_len": 128},
                     delta_options={"distill_steps": 2})  # BitDelta distils on the chosen answers
    result = run_job(spec, tmp_path / "store", tmp_path / "work", events)
    assert result.status is JobStatus.SUCCEEDED, result.error
    assert result.hyperparameters["beta"] == 0.2 and [m["step"] for m in events.metrics()] == [1, 2, 3]
    assert result.trained_tokens is not None and result.trained_tokens > 12 * 8  # chosen and rejected, each row
    record = VariantStore(tmp_path / "store").get(spec.variant)
    assert record.training["stage"] == "dpo" and record.training["pref_beta"] == 0.2 and record.method == "bitdelta"


def test_a_cancelled_job_leaves_no_variant(tmp_path, tiny_model_dir):
    file = write_jsonl(tmp_path / "train.jsonl", [chat_row(q) for q in QUESTIONS])
    cancel = threading.Event()
    events = Events()

    def on_event(level, message, data):
        events(level, message, data)
        if data and data.get("step") == 2 and "train_loss" in data:
            cancel.set()  # as a worker's poll of the job's row would

    result = run_job(tiny_spec(tiny_model_dir, file), tmp_path / "store", tmp_path / "work", on_event, cancel)
    assert result.status is JobStatus.CANCELLED and result.fine_tuned_model is None
    assert [m["step"] for m in events.metrics()] == [1, 2]
    assert events.messages()[-1] == "Fine-tuning job cancelled"
    assert VariantStore(tmp_path / "store").users() == []


def test_a_job_cancelled_after_training_publishes_nothing(tmp_path, tiny_model_dir):
    # Training is the shorter part of a small job: compression (BitDelta's distillation), the gain and publishing
    # follow it. A cancel that arrives once training has saved its run must still leave no variant.
    from gym.train.installing import is_finished_output

    file = write_jsonl(tmp_path / "train.jsonl", [chat_row(q) for q in QUESTIONS])
    events = Events()
    run = tmp_path / "work" / "run"
    result = run_job(tiny_spec(tiny_model_dir, file), tmp_path / "store", tmp_path / "work", events,
                     lambda: is_finished_output(run))
    assert result.status is JobStatus.CANCELLED and result.fine_tuned_model is None
    assert "The job has successfully completed" not in events.messages()
    assert events.messages()[-1] == "Fine-tuning job cancelled"
    assert VariantStore(tmp_path / "store").users() == []


def test_a_job_stopped_by_ctrl_c_is_not_ended_and_resumes_from_its_checkpoint(tmp_path, tiny_model_dir):
    # Ctrl-C at `gym api`'s terminal reaches its workers too: training saves a checkpoint and stops. That job failed
    # ("stopped ... on request; the checkpoint is /server/path"), and its worker then removed the checkpoint.
    from gym.core.errors import RunStopped

    file = write_jsonl(tmp_path / "train.jsonl", [chat_row(q) for q in QUESTIONS])
    spec = tiny_spec(tiny_model_dir, file, training={"cutoff_len": 128, "max_steps": 6}, delta_method="int8",
                     delta_options={})
    store, work = tmp_path / "store", tmp_path / "work"
    events = Events()

    def on_event(level, message, data):
        events(level, message, data)
        if data and data.get("step") == 2 and "train_loss" in data:
            os.kill(os.getpid(), signal.SIGINT)  # the terminal's Ctrl-C, to this (the main) thread

    with pytest.raises(RunStopped):
        run_job(spec, store, work, on_event)
    assert not any(m.startswith("Fine-tuning job failed") for m in events.messages())
    saved = sorted(int(p.name.split("-")[1]) for p in (work / "run").glob("checkpoint-*"))
    assert saved and 2 <= saved[-1] < 6 and VariantStore(store).users() == []

    again = Events()
    result = run_job(spec, store, work, again)
    assert result.status is JobStatus.SUCCEEDED and result.resumed_from_step == saved[-1], result.error
    assert [m["step"] for m in again.metrics()] == list(range(saved[-1] + 1, 7))


WORKER = """
import json, sys, time
from gym.service.events import openai_event
from gym.service.jobs import JobSpec, run_job

spec = JobSpec(**json.loads(open(sys.argv[1]).read()))
def on_event(level, message, data):
    with open(sys.argv[4], "a") as f:
        f.write(json.dumps(openai_event(level, message, data)) + "\\n")
    if data and "train_loss" in data:
        time.sleep(1.0)  # a slow sink (a database write): the test's kill lands in the middle of training
run_job(spec, sys.argv[2], sys.argv[3], on_event)
"""


def test_a_killed_job_resumes_from_its_checkpoint_and_publishes_once(tmp_path, tiny_model_dir):
    file = write_jsonl(tmp_path / "train.jsonl", [chat_row(q) for q in QUESTIONS])
    validation = write_jsonl(tmp_path / "valid.jsonl", [chat_row(f"Name {i}?") for i in range(3)])
    spec = tiny_spec(tiny_model_dir, file, training={"cutoff_len": 128, "max_steps": 10, "save_strategy": "steps",
                                                     "save_steps": 2}, delta_method="int8", delta_options={},
                     validation_file=validation)
    store, work = tmp_path / "store", tmp_path / "work"
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path / "spec.json"), str(store),
                                str(work), str(tmp_path / "events.jsonl")], env=env)
    try:
        deadline = time.monotonic() + 240
        while not (work / "run" / "checkpoint-2" / "trainer_state.json").is_file():
            assert process.poll() is None, "the worker ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 4 minutes"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()  # reaped: its locks are now a dead process's, which the next run takes over
    first = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert not any(e["message"].startswith("The job has successfully") for e in first)

    events = Events()
    result = run_job(spec, store, work, events)
    assert result.status is JobStatus.SUCCEEDED, result.error
    resumed = result.resumed_from_step
    assert resumed is not None and resumed >= 2 and any(m.startswith(f"Resuming from checkpoint-{resumed}")
                                                        for m in events.messages())
    assert [m["step"] for m in events.metrics()] == list(range(resumed + 1, 11))  # the rest of the steps, once
    assert VariantStore(store).users() == [spec.variant]
    assert VariantStore(store).get(spec.variant).method == "deltaquant-int8"  # the delta method the spec chose
    assert result.gain_kept is not None and any("on 3 held-out rows" in m for m in events.messages())

    again = Events()  # the same job run once more (a worker restarted after publishing): the variant is the result
    assert run_job(spec, store, work, again).status is JobStatus.SUCCEEDED
    assert again.metrics() == [] and "published before" in again.messages()[-1]
    assert VariantStore(store).users() == [spec.variant]
