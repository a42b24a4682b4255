"""A fine-tuning job's events, as its owner reads them: OpenAI's event objects (`openai_event`), the trainer
callback that makes a metrics event per step and a checkpoint event per save and stops the run when the job is
cancelled (`job_callback`), and the server's paths taken out of what a tenant reads (`hide_server_paths`)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from gym.core.errors import ConfigError, GymError


class EventSink(Protocol):
    def __call__(self, level: str, message: str, data: dict[str, Any] | None) -> None: ...


class JobCancelled(GymError):
    """The job's cancel was requested: raised inside training so that nothing after it (the variant) happens."""


def openai_event(level: str, message: str, data: dict[str, Any] | None = None, *,
                 created_at: int | None = None) -> dict[str, Any]:
    """An event as OpenAI's API returns it; a step's metrics (data with step and train_loss) are type "metrics"."""
    metrics = data is not None and "step" in data and "train_loss" in data
    return {"object": "fine_tuning.job.event", "id": f"ftevent-{uuid.uuid4().hex[:24]}",
            "created_at": int(time.time()) if created_at is None else created_at, "level": level,
            "message": message, "data": data or {}, "type": "metrics" if metrics else "message"}


def cancel_check(cancel: Callable[[], bool] | Any | None) -> Callable[[], bool]:
    """A callable, or anything with is_set() (threading.Event, multiprocessing.Event), as one callable."""
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return lambda: bool(cancel.is_set())
    if callable(cancel):
        return lambda: bool(cancel())
    raise ConfigError(f"cancel must be a callable or an event, got {type(cancel).__name__}.")


def job_callback(emit: EventSink, cancelled: Callable[[], bool], progress: dict[str, Any]) -> Any:
    """A Trainer callback: a metrics event per logged step, a checkpoint event per save, and the cancel check
    between steps (it raises, so the run ends there and nothing after it, the variant included, happens)."""
    from transformers import TrainerCallback

    class JobCallback(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cancelled():
                raise JobCancelled(f"cancelled at step {state.global_step}")

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not state.is_world_process_zero or not logs or not isinstance(logs.get("loss"), (int, float)):
                return
            step, loss = int(state.global_step), float(logs["loss"])
            progress["step"] = step
            emit("info", f"Step {step}/{state.max_steps}: training loss={loss:.4f}",
                 {"step": step, "train_loss": loss, "total_steps": int(state.max_steps)})

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                emit("info", f"Checkpoint created at step {state.global_step}",
                     {"step": int(state.global_step), "checkpoint": f"checkpoint-{state.global_step}"})

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cancelled():  # asked during the last step: still before the variant is made
                raise JobCancelled(f"cancelled at step {state.global_step}")

    return JobCallback()


# A path a client reads: an absolute one, starting where a word or a quoted string does (not inside a URL's `//`,
# a fraction's `1/2` or a relative path already shown as its tail).
_ABSOLUTE_PATH = re.compile(r"(?:^|(?<=[\s'\"(\[=,:]))/(?!/)[^\s'\"()\[\],:]+")
SERVER_PATH = "a server path"  # what a tenant reads in place of a path of the server's no folder below names


def _machine_folders() -> list[tuple[Path, str, bool]]:
    """This machine's caches, which any job's error may name (a model's download, a converted model)."""
    from gym.core.home import gym_home

    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    folders = [(gym_home(), "Gym's cache", False), (hf_home, "the model cache", False)]
    folders += [(Path(os.environ[v]).expanduser(), "the model cache", False)
                for v in ("HF_HUB_CACHE", "TRANSFORMERS_CACHE") if os.environ.get(v)]
    return folders


def hide_server_paths(value: Any, folders: Iterable[tuple[str | Path, str, bool]] = ()) -> Any:
    """`value` (text, or a job event's data: lists and objects of it) as a tenant may read it: no path of the
    server's. Each of `folders` is (folder, name, keep_below): the folder, as given and resolved, becomes `name`,
    and with keep_below what follows it under the folder is kept (`STORE/.service/jobs/<id>/run` -> `<id>/run`;
    an empty name keeps that part alone: `STORE/.service/files/file-1` -> `file-1`);
    this machine's caches are named too, and any other absolute path becomes SERVER_PATH. A message names the store
    layout, the user running the server and other tenants' variants through a path; the server's log keeps it
    whole."""
    names: dict[str, tuple[str, bool]] = {}
    for folder, name, keep_below in [*folders, *_machine_folders()]:
        for form in {str(folder), str(Path(folder).expanduser().resolve())}:
            if form != "/" and "/" in form:  # a bare relative name ("store") would be taken out of plain words
                names.setdefault(form.rstrip("/"), (name, keep_below))

    def rename(match: re.Match[str]) -> str:
        name, keep_below = names[match.group(1)]
        below = match.group(2) or ""
        if keep_below and below.strip("/"):
            return name + below if name else below.lstrip("/")
        return name or SERVER_PATH

    # the longest first: a job's folder is inside the store, and is named before the store is
    alternatives = "|".join(re.escape(form) for form in sorted(names, key=len, reverse=True))
    named = re.compile(rf"(?<![\w.~/-])({alternatives})(/[^\s'\"()\[\],:]*)?(?![\w-]|\.[\w.])") if names else None

    def hide(item: Any) -> Any:
        if isinstance(item, dict):
            return {key: hide(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [hide(inner) for inner in item]
        if not isinstance(item, str):
            return item
        return _ABSOLUTE_PATH.sub(SERVER_PATH, named.sub(rename, item) if named is not None else item)

    return hide(value)


__all__ = ["SERVER_PATH", "EventSink", "JobCancelled", "cancel_check", "hide_server_paths", "job_callback",
           "openai_event"]
