"""Experiment trackers (`report_to: wandb | tensorboard | mlflow`), on top of transformers' own callbacks.

transformers' WandbCallback, TensorBoardCallback and MLflowCallback open the tracker's run and log the
TrainingArguments, every logged step and the Trainer's closing summary (train_loss, train_runtime, ...).
Gym adds what they leave out:
- Gym's whole resolved config (model, data, adapter, the stage's options: what gym_config.yaml holds),
  flattened under `gym/` (`GymConfigCallback`);
- ending the tracker runs when Gym's run ends, after the final evaluation, marked failed when it raised
  (`runs_closed`): wandb's callback never ends its run, so the next run in the same process (the Python API,
  gym tune) would log into it;
- the same callbacks driven by Gym's own loop (stage ppo), which is not a Trainer (`LoopReporter`).
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Any

import yaml
from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback
from transformers.integrations.integration_utils import get_reporting_integration_callbacks

from gym.config.args import TrainArgs
from gym.core.errors import RunStopped
from gym.train.outputs import resolved_config

logger = logging.getLogger(__name__)

TRACKER_CALLBACKS = (WandbCallback, TensorBoardCallback, MLflowCallback)
PREFIX = "gym/"  # apart from the TrainingArguments transformers logs, some of which share a name with different values


def flat_config(config: dict[str, Any], prefix: str = PREFIX) -> dict[str, Any]:
    """`{"rope_scaling": {"factor": 2}}` -> `{"gym/rope_scaling.factor": 2}`: trackers compare runs key by key,
    so nested values are spread out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def without_secrets(config: dict[str, Any]) -> dict[str, Any]:
    """The config with its tokens (hf_hub_token) hidden, as transformers hides its own: a tracker's run is often
    shared, or stored on someone else's server."""
    return {k: f"<{k.upper()}>" if k.endswith("_token") and v is not None else v for k, v in config.items()}


class GymConfigCallback(TrainerCallback):
    """Adds Gym's resolved config to the runs that `trackers` (transformers' callbacks) opened. Added after them,
    so their on_train_begin has opened the runs when this one's is called."""

    def __init__(self, config: dict[str, Any], trackers: Sequence[TrainerCallback]) -> None:
        self.config = without_secrets(config)
        self.trackers = list(trackers)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        flat = flat_config(self.config)
        for tracker in self.trackers:
            if isinstance(tracker, WandbCallback):
                _to_wandb(flat)
            elif isinstance(tracker, TensorBoardCallback):
                _to_tensorboard(tracker.tb_writer, self.config, flat)
            elif isinstance(tracker, MLflowCallback):
                _to_mlflow(self.config, flat)


def _to_wandb(flat: dict[str, Any]) -> None:
    import wandb

    if wandb.run is not None:
        wandb.config.update(flat, allow_val_change=True)


def _to_tensorboard(writer: Any, config: dict[str, Any], flat: dict[str, Any]) -> None:
    if writer is None:
        return
    writer.add_text("gym_config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```")
    # The summary protos must come from the writer's own library (torch's writer, or tensorboardX's).
    library = "tensorboardX" if type(writer).__module__.startswith("tensorboardX") else "torch.utils.tensorboard"
    hparams = importlib.import_module(f"{library}.summary").hparams
    # Written into the run's own event file (add_hparams would start a second run beside it), naming the loss
    # curves so that the HParams dashboard compares runs by them.
    values = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in flat.items() if v is not None}
    for summary in hparams(values, {"train/loss": 0.0, "train/train_loss": 0.0}):
        writer._get_file_writer().add_summary(summary)
    writer.flush()


def _to_mlflow(config: dict[str, Any], flat: dict[str, Any]) -> None:
    import mlflow
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

    run = mlflow.active_run()
    if run is None:
        return
    # MLflow refuses some characters in names and long values; the whole config is the artifact beside them.
    params = [(re.sub(r"[^0-9A-Za-z_\-. :/]", "_", k), str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flat.items()]
    # A run continued through MLFLOW_RUN_ID keeps its first value of each param: MLflow refuses a change.
    logged = mlflow.get_run(run.info.run_id).data.params
    changed = [k for k, v in params if logged.get(k, v) != v]
    if changed:
        logger.warning("MLflow run %s keeps its first values of %s.", run.info.run_id, ", ".join(changed))
    params = [(k, v) for k, v in params if k not in logged]
    for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
        mlflow.log_params(dict(params[start:start + MAX_PARAMS_TAGS_PER_BATCH]))
    mlflow.log_text(yaml.safe_dump(config, sort_keys=False), "gym_config.yaml")


def attach(trainer: Any, args: TrainArgs[Any], model_path: str) -> None:
    trackers = [c for c in trainer.callback_handler.callbacks if isinstance(c, TRACKER_CALLBACKS)]
    if trackers:
        trainer.add_callback(GymConfigCallback(resolved_config(args, model_path), trackers))


@contextmanager
def runs_closed(callbacks: Sequence[TrainerCallback]) -> Iterator[None]:
    """End the wandb and MLflow runs that `callbacks` open inside the block, when it ends: finished, failed (an
    exception) or killed (stopped on request, resumable). A run the caller opened before (wandb.init or
    mlflow.start_run around a Python API call) is the caller's to end."""
    wandb: Any = None
    mlflow: Any = None
    if any(isinstance(c, WandbCallback) for c in callbacks):
        import wandb as wandb_module

        wandb = wandb_module if wandb_module.run is None else None
    if any(isinstance(c, MLflowCallback) for c in callbacks):
        import mlflow as mlflow_module

        mlflow = mlflow_module if mlflow_module.active_run() is None else None
    status = "FINISHED"
    try:
        yield
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, (RunStopped, KeyboardInterrupt)) else "FAILED"
        raise
    finally:
        if wandb is not None and wandb.run is not None:
            wandb.finish(exit_code=0 if status == "FINISHED" else 1)
        if mlflow is not None and mlflow.active_run() is not None:
            mlflow.end_run(status=status)


class LoopReporter:
    """transformers' tracker callbacks (and `GymConfigCallback`) driven by a loop that is not a Trainer (stage
    ppo), so that its runs reach the trackers as a Trainer's do: the config, each logged step, the closing summary
    under the Trainer's names. Use as a context manager around the loop: `log` each step, `end` after the last."""

    def __init__(self, args: TrainArgs[Any], run_args: Any, model: Any, tokenizer: Any, model_path: str, *,
                 max_steps: int, done_steps: int, enabled: bool = True) -> None:
        """run_args: the run's transformers.TrainingArguments (gym.train.hf_args), what the callbacks read."""
        trackers = [cls() for cls in get_reporting_integration_callbacks(run_args.report_to)] if enabled else []
        self.callbacks = [*trackers, GymConfigCallback(resolved_config(args, model_path), trackers)] if trackers else []
        self.args = run_args
        self.objects = {"model": model, "processing_class": tokenizer}
        self.state = TrainerState(max_steps=max_steps, global_step=done_steps)
        self.control = TrainerControl()
        self.done_steps = done_steps
        self.losses: list[float] = []
        self.started = time.perf_counter()
        self.stack = ExitStack()

    def __enter__(self) -> LoopReporter:
        self.stack.enter_context(runs_closed(self.callbacks))
        self.started = time.perf_counter()
        self._event("on_train_begin")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        return bool(self.stack.__exit__(kind, exc, tb))

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.state.global_step = step
        if isinstance(values.get("loss"), (int, float)):
            self.losses.append(float(values["loss"]))
        self._event("on_log", logs=dict(values))

    def end(self) -> None:
        seconds = max(time.perf_counter() - self.started, 1e-9)
        summary = {"train_runtime": round(seconds, 4),
                   "train_steps_per_second": round((self.state.global_step - self.done_steps) / seconds, 3)}
        if self.losses:
            summary["train_loss"] = sum(self.losses) / len(self.losses)  # the run's mean, as the Trainer reports it
        self._event("on_log", logs=summary)
        self._event("on_train_end")

    def _event(self, name: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, name)(self.args, self.state, self.control, **self.objects, **kwargs)
