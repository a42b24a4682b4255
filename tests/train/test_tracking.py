"""report_to: wandb, tensorboard and mlflow, each read back from what it wrote on disk (wandb offline, a local
MLflow store, TensorBoard event files): the run's steps, its closing summary, and Gym's whole config (what
gym_config.yaml holds) beside the TrainingArguments transformers logs. One run reports to all three (the tests
below share it); `none` writes nothing; a missing package fails at parse time with the pip command."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym.core.errors import ConfigError
from gym.train.outputs import read_log
from gym.workflows.training import run_exp


def _offline_trackers(mp: pytest.MonkeyPatch, root: Path) -> None:
    """Every tracker writes under `root` and nothing leaves the machine."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (root / name.lower()).mkdir(parents=True, exist_ok=True)
        mp.setenv(name, str(root / name.lower()))
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_PROJECT", "gym-tests")
    mp.setenv("WANDB_CONSOLE", "off")  # wandb would otherwise wrap stdout/stderr, which pytest captures
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("MLFLOW_TRACKING_URI", (root / "mlruns").as_uri())
    # MLflow 3 wants a database store; the file store it still reads and writes is faster to set up in a test.
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "WANDB_RUN_ID", "TENSORBOARD_LOGGING_DIR"):
        mp.delenv(name, raising=False)


@pytest.fixture(scope="module")
def _shared() -> dict[str, Any]:
    return {}


@pytest.fixture()
def tracked(train_config, tmp_path_factory, _shared) -> dict[str, Any]:
    """One 3-step run reporting to wandb, tensorboard and mlflow (made by whichever test asks first)."""
    if not _shared:
        import wandb

        root = tmp_path_factory.mktemp("tracked")
        with pytest.MonkeyPatch.context() as mp:
            _offline_trackers(mp, root)
            result = run_exp(train_config(report_to=["wandb", "tensorboard", "mlflow"], output_dir=str(root / "out")))
            _shared["wandb_run_left_open"] = wandb.run is not None
        out = Path(result.output_dir)
        _shared.update(root=root, out=out, config=yaml.safe_load((out / "gym_config.yaml").read_text()),
                       losses=[e["loss"] for e in read_log(out) if "loss" in e])
    return _shared


def _expected_params(config: dict[str, Any]) -> set[str]:
    assert not any(isinstance(v, dict) for v in config.values())  # nothing nested in this config to spread out
    return {f"gym/{key}" for key in config}


def _check_config_values(get: Any, tiny_model_dir: Path) -> None:
    """The keys that say what this run was (read through `get(name)`, as the tracker stores them)."""
    assert str(get("gym/stage")) == "sft" and str(get("gym/finetuning_type")) == "lora"
    assert str(get("gym/dataset")) == "tiny_alpaca" and str(get("gym/lora_rank")) == "8"
    assert str(get("gym/max_steps")) == "3" and str(get("gym/resolved_model_path")) == str(tiny_model_dir)


# --- wandb (offline): the run's transaction log, the file `wandb sync` uploads.

def _wandb_records(path: Path) -> list[Any]:
    """The records of a .wandb file: a LevelDB-style log of 32 KiB blocks, each record's protobuf split into
    chunks with a 7-byte header (crc32, length, kind: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding at the end of a block
            pos += room
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_holds_config_and_final_metrics(tracked, tiny_model_dir):
    runs = list((tracked["root"] / "wandb_dir" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    records = _wandb_records(next(runs[0].glob("run-*.wandb")))
    config, summary, history = {}, {}, []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update if item.key})
        elif kind == "history":
            history.append({"/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})

    assert _expected_params(tracked["config"]) <= set(config)
    _check_config_values(config.get, tiny_model_dir)
    assert config["learning_rate"] == 0.01  # transformers' own TrainingArguments are there too
    assert summary["train_loss"] == pytest.approx(sum(tracked["losses"]) / 3, rel=1e-4)
    assert summary["train_runtime"] > 0
    assert [h["train/loss"] for h in history if "train/loss" in h] == pytest.approx(tracked["losses"])
    # Ended when Gym's run ended, not at the exit of the process: the next run in it gets a run of its own.
    assert any(r.WhichOneof("record_type") == "exit" for r in records)
    assert not tracked["wandb_run_left_open"]


# --- TensorBoard: event files under output_dir/runs/.

def test_tensorboard_events_hold_losses_and_config(tracked, tiny_model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    (log_dir,) = list((tracked["out"] / "runs").iterdir())
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [s.step for s in losses] == [1, 2, 3]
    assert [s.value for s in losses] == pytest.approx(tracked["losses"])
    assert events.Scalars("train/train_loss")[0].value == pytest.approx(sum(tracked["losses"]) / 3, rel=1e-4)
    assert events.Scalars("train/train_runtime")[0].value > 0

    (text,) = events.Tensors("gym_config/text_summary")
    shown = tensor_util.make_ndarray(text.tensor_proto).item().decode()
    assert yaml.safe_load(shown.removeprefix("```yaml\n").removesuffix("```")) == tracked["config"]

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    set_keys = {f"gym/{k}" for k, v in tracked["config"].items() if v is not None}  # TensorBoard drops None
    assert set(hparams) == set_keys

    def value(name: str) -> Any:
        field = hparams[name]
        return field.string_value if field.HasField("string_value") else int(field.number_value)

    _check_config_values(value, tiny_model_dir)


# --- MLflow: a local store.

def test_mlflow_run_holds_config_params_and_final_metrics(tracked, tiny_model_dir, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((tracked["root"] / "mlruns").as_uri())
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert {k for k in params if k.startswith("gym/")} == _expected_params(tracked["config"])
    _check_config_values(params.get, tiny_model_dir)
    assert params["gym/report_to"] == str(["wandb", "tensorboard", "mlflow"])
    metrics = run.data.metrics
    assert metrics["loss"] == pytest.approx(tracked["losses"][-1])
    assert metrics["train_loss"] == pytest.approx(sum(tracked["losses"]) / 3, rel=1e-4)
    assert metrics["train_runtime"] > 0
    artifact = Path(client.download_artifacts(run.info.run_id, "gym_config.yaml", str(tracked["root"])))
    assert yaml.safe_load(artifact.read_text()) == tracked["config"]


# --- none, and the checks at parse time.

def test_none_writes_nothing_anywhere(train_config, tmp_path, monkeypatch):
    _offline_trackers(monkeypatch, tmp_path / "trackers")
    result = run_exp(train_config(report_to="none", max_steps=1))
    assert not (Path(result.output_dir) / "runs").exists()
    assert not (tmp_path / "trackers" / "mlruns").exists()
    assert not any((tmp_path / "trackers").rglob("*.wandb"))


def test_ppo_reaches_the_trackers_through_the_same_callbacks(prompt_config, monkeypatch):
    """Gym's own PPO loop (not a Trainer) gives the trackers its steps, summary and config."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    result = run_exp(prompt_config(stage="ppo", per_device_train_batch_size=2, ppo_buffer_size=1, ppo_epochs=1,
                                   max_steps=1, report_to="tensorboard"))
    (log_dir,) = list((Path(result.output_dir) / "runs").iterdir())
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    logged = read_log(result.output_dir)
    rewards = events.Scalars("train/reward")
    assert [s.step for s in rewards] == [e["step"] for e in logged] == [1]
    assert [s.value for s in rewards] == pytest.approx([e["reward"] for e in logged])
    assert events.Scalars("train/train_loss")[0].value == pytest.approx(logged[0]["loss"], rel=1e-4)
    assert "stage: ppo" in str(events.Tensors("gym_config/text_summary")[0].tensor_proto)


def test_missing_tracker_package_is_a_config_error_with_the_pip_command(train_config, tmp_path, monkeypatch,
                                                                        capsys):
    from gym.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # what find_spec and import see when wandb is not installed
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(train_config(report_to=["tensorboard", "wandb"])))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "report_to: wandb" in err and "pip install 'zoo-gym[tracking]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_report_to_names_are_checked_and_comma_lists_split(train_config):
    from gym.config.parser import get_train_args

    assert get_train_args(train_config(report_to="tensorboard, mlflow")).training.report_to == ["tensorboard", "mlflow"]
    assert get_train_args(train_config(report_to="none")).training.report_to == "none"  # transformers' own word
    from gym.train.hf_args import hf_training_args

    assert hf_training_args(get_train_args(train_config(report_to="none"))).report_to == []
    with pytest.raises(ConfigError, match="unknown tracker 'wandbb'. Did you mean 'wandb'"):
        get_train_args(train_config(report_to="wandbb"))
    with pytest.raises(ConfigError, match="stands alone"):
        get_train_args(train_config(report_to=["none", "wandb"]))


def test_hub_tokens_never_reach_gym_config_or_trackers(train_config):
    from gym.config.parser import get_train_args
    from gym.train.outputs import resolved_config

    config = resolved_config(get_train_args(train_config(hf_hub_token="hf_secret123")), "model")
    assert config["hf_hub_token"] == "<hidden>" and "hf_secret123" not in str(config)


def test_wandb_without_a_login_is_one_line_saying_what_to_do(train_config, tmp_path, monkeypatch):
    """No W&B key and no terminal to ask for one: wandb's UsageError came out of the Trainer's first callback as a
    traceback. Nothing leaves the machine: wandb stops at the missing key."""
    _offline_trackers(monkeypatch, tmp_path)
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no settings holding a key
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    import wandb

    wandb.teardown()  # wandb keeps the settings (offline mode) of a run made earlier in this process
    with pytest.raises(ConfigError, match=r"^'report_to: wandb' could not log in to W&B \(.*\)\. Run `wandb login` "
                                          r"or set WANDB_API_KEY; or set WANDB_MODE=offline"):
        run_exp(train_config(report_to="wandb", max_steps=1))
