"""One fine-tuning job, with OpenAI's fine-tuning API semantics, as a library: no HTTP, no database.

    spec = JobSpec(job_id=new_job_id(), user_id="alice", model="smollm2-135m", training_file="train.jsonl",
                   suffix="support")
    result = run_job(spec, store_dir="variants/smollm2-135m", work_dir="jobs/" + spec.job_id,
                     on_event=lambda level, message, data: print(level, message, data))
    result.fine_tuned_model   # "ft:smollm2-135m:alice:support:<id>", a variant in the store

A job reads OpenAI's JSONL (chat rows `{"messages": [...]}`, or DPO's preference rows), maps OpenAI's
hyperparameters onto Gym's training keys, and runs the same training as `gym variants create`
(gym.personalization.trainer: LoRA, then the delta from the base compressed with BitDelta by default, then
stored in the variant store under a name derived from the user, the suffix and the job id).

What a worker process needs from it: the spec is a plain, picklable dataclass; run_job keeps no global state; a
run killed at any point (even -9) is run again with the same spec and work_dir and resumes from its last complete
checkpoint (or starts over cleanly), and the variant is published at most once (an existing entry for the job is
the result); `cancel` stops it between steps and leaves no variant. Events go to `on_event(level, message, data)`;
gym.service.events.openai_event gives them OpenAI's object shape.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, DataError, GymError, RunStopped, as_gym_error
from gym.service.db import JobStatus  # OpenAI's states, one definition; run_job returns the last three
from gym.service.events import EventSink, JobCancelled, cancel_check, hide_server_paths, job_callback

logger = logging.getLogger(__name__)

JOB_PREFIX = "ftjob-"
MAX_SUFFIX = 64  # OpenAI's limit on a fine-tuned model's suffix
MIN_ROWS = 10  # OpenAI refuses a training file with fewer examples
KEPT_CHECKPOINTS = 3  # a checkpoint per epoch, the last three kept, as OpenAI keeps them
HELD_OUT_MIN_ROWS = 10  # gym.personalization.trainer's rule: below this, no rows are held out for the gain kept
RUN_FOLDER = "run"  # the training run inside work_dir (checkpoint-N/, trainer_log.jsonl, the final adapter)
_JOB_ID = re.compile(r"ftjob-[A-Za-z0-9]{1,40}")
_SUFFIX = re.compile(r"[A-Za-z0-9._-]*")  # stricter than OpenAI's (which takes any text): it must name a folder
_ROLES = ("system", "user", "assistant", "tool")

# learning_rate_multiplier x this is the run's learning rate (LoRA: a fresh adapter tolerates a high rate).
BASE_LEARNING_RATE = {"supervised": 5e-4, "dpo": 5e-5}
DEFAULT_BETA = 0.1  # DPO's beta when "auto": TRL's and the paper's default
TARGET_EXAMPLES = 100  # "auto" epochs: enough passes that a small file is seen ~100 times (OpenAI does alike)
MAX_AUTO_EPOCHS = 25


class Method(str, Enum):
    SUPERVISED = "supervised"
    DPO = "dpo"


# -- the spec ------------------------------------------------------------------------------------------------------
def new_job_id() -> str:
    return JOB_PREFIX + uuid.uuid4().hex[:24]


# OpenAI's ranges (its API's schema): n_epochs 1-50, batch_size 1-256, learning_rate_multiplier above 0, beta in
# (0, 2], seed 0 to 2**31 - 1. A request valid here is valid there, and the reverse: a client moving between them
# meets the same refusals.
MAX_EPOCHS, MAX_BATCH_SIZE, MAX_BETA = 50, 256, 2.0
SEED_MAX = 2**31 - 1


def _shown(value: Any) -> str:
    """A value as a refusal quotes it: an integer too long to print (Python refuses past 4300 digits) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _auto_or(value: Any, name: str, kind: type, most: float | None = None) -> None:
    """`value` is "auto", or a finite `kind` above 0 (and at most `most`), or a ConfigError naming
    hyperparameters.`name`."""
    if value == "auto":
        return
    numeric = kind is float and isinstance(value, (int, float))
    if isinstance(value, bool) or not (isinstance(value, kind) or numeric):
        raise ConfigError(f"hyperparameters.{name}: give \"auto\" or a{'n integer' if kind is int else ' number'}, "
                          f"got {value!r}.")
    # NaN and inf: JSON has neither, but 1e400 in a body parses as inf, and a Python caller passes either; an
    # integer past a float's range (10**400) is as far from a number training can use, and float() of it raised
    # OverflowError, a 500.
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = kind is int  # an n_epochs of 10**400 is refused as past its most, below
    if not finite:
        raise ConfigError(f"hyperparameters.{name} must be a finite positive number, got {_shown(value)}.")
    if not value > 0:
        raise ConfigError(f"hyperparameters.{name} must be positive, got {_shown(value)}.")
    if most is not None and value > most:
        raise ConfigError(f"hyperparameters.{name} is at most {most:g}, got {_shown(value)}.")


@dataclass(frozen=True)
class Hyperparameters:
    """OpenAI's hyperparameters; each is "auto" or a value (see `training_keys` for what each becomes)."""

    n_epochs: int | str = "auto"
    batch_size: int | str = "auto"
    learning_rate_multiplier: float | str = "auto"
    beta: float | str = "auto"  # dpo only

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> Hyperparameters:
        """From a request's `hyperparameters` object: an unknown key is an error naming the known ones."""
        values = dict(values or {})
        known = {"n_epochs", "batch_size", "learning_rate_multiplier", "beta"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"hyperparameters.{unknown[0]} is not a hyperparameter; use {', '.join(sorted(known))}.")
        hyper = cls(**values)
        hyper.check()
        return hyper

    def check(self, method: Method | None = None) -> None:
        """Each value "auto" or of its type and in OpenAI's range; with the job's `method`, beta only for dpo."""
        _auto_or(self.n_epochs, "n_epochs", int, MAX_EPOCHS)
        _auto_or(self.batch_size, "batch_size", int, MAX_BATCH_SIZE)
        _auto_or(self.learning_rate_multiplier, "learning_rate_multiplier", float)
        _auto_or(self.beta, "beta", float, MAX_BETA)
        if self.beta != "auto" and method is Method.SUPERVISED:
            raise ConfigError("hyperparameters.beta is a dpo hyperparameter; remove it or use method dpo.")
        multiplier = self.learning_rate_multiplier
        if multiplier != "auto" and method is not None:
            # The run's rate is the product: any finite multiplier is OpenAI's to take, but one that overflows it to
            # inf (or underflows it to 0) would train on NaN weights, or not at all.
            base = BASE_LEARNING_RATE[method.value]
            rate = float(multiplier) * base
            if not (math.isfinite(rate) and rate > 0):
                raise ConfigError(f"hyperparameters.learning_rate_multiplier {_shown(multiplier)} makes the learning "
                                  f"rate {base:g} x {_shown(multiplier)} = {rate:g}, which training cannot use; give "
                                  f"a {'smaller' if rate > 0 else 'larger'} multiplier.")


@dataclass(frozen=True)
class JobSpec:
    """What one job needs, all plain values (a worker process receives it pickled or as JSON).

    `model` is the base as served (it goes into the fine-tuned model's name); `base_path` is where Gym loads it
    from (a Gym model name or a folder; default: `model`). `delta_method`: "bitdelta" (1 bit a weight, scales
    distilled on the job's rows) or a DeltaQuant method (int8, int4, int2, ternary, binary); `delta_options`: that
    method's options (BitDeltaConfig / DeltaQuantConfig fields). `training`: Gym training keys the operator puts
    on top of the mapped hyperparameters (cutoff_len, max_steps, save_steps, lora_rank, ...); not a user's knob.
    """

    job_id: str
    user_id: str
    model: str
    training_file: str
    validation_file: str | None = None
    method: Method = Method.SUPERVISED
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    suffix: str = ""
    seed: int = 42
    delta_method: str = "bitdelta"
    delta_options: dict[str, Any] = field(default_factory=dict)
    base_path: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    safety_gate: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _method(self.method))
        if isinstance(self.hyperparameters, dict):
            object.__setattr__(self, "hyperparameters", Hyperparameters.from_dict(self.hyperparameters))
        self.check()

    def check(self) -> None:
        """Every rule a job is held to before anything loads (also run by run_job: unpickling skips __init__)."""
        if not isinstance(self.job_id, str) or not _JOB_ID.fullmatch(self.job_id):
            raise ConfigError(f"job id {self.job_id!r}: expected ftjob- and 1 to 40 letters or digits "
                              "(new_job_id() makes one).")
        name = FineTunedModel(self.model, self.user_id, self.suffix, self.job_id)
        name.check()
        self.hyperparameters.check(self.method)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"seed must be an integer from 0 to {SEED_MAX}, got {self.seed!r}.")
        _delta_config(self.delta_method, self.delta_options)  # an unknown method or option fails now
        _safety_gate(self.safety_gate)
        for key in ("model_name_or_path", "stage", "dataset", "dataset_dir", "output_dir"):
            if key in self.training:
                raise ConfigError(f"training.{key} is set by the job itself; remove it.")

    @property
    def fine_tuned_model(self) -> str:
        return str(FineTunedModel(self.model, self.user_id, self.suffix, self.job_id))

    @property
    def variant(self) -> str:
        """The entry in the variant store holding this job's variant."""
        return FineTunedModel(self.model, self.user_id, self.suffix, self.job_id).variant

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (for a queue or a database row); JobSpec(**spec.to_dict()) is the same spec."""
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values["method"] = self.method.value
        values["hyperparameters"] = dict(vars(self.hyperparameters))
        return values


def check_job_options(options: dict[str, Any]) -> None:
    """The operator's options for every job (`gym api --job_options`), held to the rules a job's spec is, once when
    the server starts: a key a job owns, a misspelt training key or an unknown delta method would otherwise fail
    each job only when a worker claims it."""
    from gym.config.parser import check_keys

    training = options.get("training") or {}
    if not isinstance(training, dict):
        raise ConfigError(f"training must be an object of Gym training keys, got {type(training).__name__}.")
    JobSpec(job_id="ftjob-check", user_id="check", model="base", training_file="rows.jsonl", training=training,
            delta_method=options.get("delta_method", "bitdelta"),
            delta_options=dict(options.get("delta_options") or {}), safety_gate=options.get("safety_gate"))
    try:
        check_keys(training)
    except ConfigError as exc:
        raise ConfigError(f"training: {exc}") from None
    gate = _safety_gate(options.get("safety_gate"))
    if gate is not None:  # the set reads and the judge's spec parses, as --safety-gate's are checked: not per job
        gate.check()


def _method(value: Method | str) -> Method:
    try:
        return Method(getattr(value, "value", value))
    except ValueError:
        raise ConfigError(f"method {value!r}: use supervised or dpo.") from None


# -- naming --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FineTunedModel:
    """OpenAI's fine-tuned model name, `ft:<base>:<user>:<suffix>:<id>` (`ft:<base>:<user>::<id>` without a
    suffix), where <id> is the job id without its `ftjob-` prefix."""

    base: str
    user: str
    suffix: str
    job_id: str

    def __str__(self) -> str:
        return f"ft:{self.base}:{self.user}:{self.suffix}:{self.job_id.removeprefix(JOB_PREFIX)}"

    @property
    def variant(self) -> str:
        """The variant store's entry: user+suffix+job id (a store name; the job id alone makes it unique, the user
        and suffix make a listing readable and let one user own many)."""
        from gym.personalization.store import check_user_id

        return check_user_id(f"{self.user}+{self.suffix}+{self.job_id}")

    def check(self) -> None:
        from gym.personalization.store import MAX_USER_ID, check_user_id

        if not isinstance(self.base, str) or not self.base or ":" in self.base or any(c.isspace() for c in self.base):
            raise ConfigError(f"base model {self.base!r}: give its served name, without ':' or spaces.")
        check_user_id(self.user)
        if ":" in self.user or "+" in self.user:
            raise ConfigError(f"user id {self.user!r}: a job's user id may not hold ':' or '+' (they separate the "
                              "parts of a fine-tuned model's name).")
        if not isinstance(self.suffix, str) or len(self.suffix) > MAX_SUFFIX:
            raise ConfigError(f"suffix {str(self.suffix)[:20]!r}...: {len(str(self.suffix))} characters, at most "
                              f"{MAX_SUFFIX}.")
        if not _SUFFIX.fullmatch(self.suffix):
            raise ConfigError(f"suffix {self.suffix!r}: use letters, digits and . _ - only.")
        entry = f"{self.user}+{self.suffix}+{self.job_id}"
        if len(entry) > MAX_USER_ID:
            raise ConfigError(f"user id and suffix are too long together ({len(entry)} characters with the job id, "
                              f"at most {MAX_USER_ID}); shorten the suffix.")


def parse_fine_tuned_model(name: str) -> FineTunedModel:
    """`ft:<base>:<user>:<suffix>:<id>` -> its parts (the job id with its ftjob- prefix); a clear error if not."""
    parts = name.split(":") if isinstance(name, str) else []
    if len(parts) != 5 or parts[0] != "ft" or not parts[1] or not parts[2] or not parts[4]:
        raise ConfigError(f"{name!r} is not a fine-tuned model name: expected ft:<base>:<user>:<suffix>:<id> "
                          "(the suffix may be empty: ft:<base>:<user>::<id>).")
    parsed = FineTunedModel(parts[1], parts[2], parts[3], JOB_PREFIX + parts[4])
    if not _JOB_ID.fullmatch(parsed.job_id):
        raise ConfigError(f"{name!r}: its id {parts[4]!r} is not a job id (letters and digits).")
    parsed.check()
    return parsed


# -- the training file ---------------------------------------------------------------------------------------------
def _messages(path: str, line: int, value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{path}, line {line}: {where} must be a non-empty list of messages.")
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise DataError(f"{path}, line {line}: {where}[{index}] needs a role of {', '.join(_ROLES)}.")
    return value


def _answer(path: str, line: int, value: Any, where: str) -> dict[str, Any]:
    """A DPO answer: a list of one assistant message (OpenAI's shape)."""
    messages = _messages(path, line, value, where)
    answer = messages[-1]
    if answer.get("role") != "assistant" or not isinstance(answer.get("content"), str) or not answer["content"]:
        raise DataError(f"{path}, line {line}: {where} must end with an assistant message with text content.")
    return {"role": "assistant", "content": answer["content"]}


def read_training_file(path: str | Path, method: Method | str, minimum: int = MIN_ROWS) -> list[dict[str, Any]]:
    """OpenAI's JSONL -> rows Gym's openai formatting reads: {"messages", "tools"?} for supervised,
    {"messages", "chosen", "rejected"} for dpo. Every problem names the file and the line; fewer than `minimum`
    rows (OpenAI's 10 for a training file) is one too."""
    method, path = _method(method), str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the training file ({exc.strerror}).") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; a training file is JSONL.") from None
    rows: list[dict[str, Any]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {line}: not valid JSON ({exc.msg}).") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {line}: expected a JSON object, got {type(row).__name__}.")
        if method is Method.DPO:
            if not isinstance(row.get("input"), dict):
                raise DataError(f"{path}, line {line}: a dpo row needs input {{\"messages\": [...]}}, "
                                "preferred_output and non_preferred_output.")
            rows.append({"messages": _messages(path, line, row["input"].get("messages"), "input.messages"),
                         "chosen": _answer(path, line, row.get("preferred_output"), "preferred_output"),
                         "rejected": _answer(path, line, row.get("non_preferred_output"), "non_preferred_output")})
            continue
        if "messages" not in row:
            hint = " (a preference row: create the job with method dpo)" if "preferred_output" in row else ""
            raise DataError(f"{path}, line {line}: a supervised row needs \"messages\"{hint}.")
        messages = _messages(path, line, row["messages"], "messages")
        if not any(m.get("role") == "assistant" for m in messages):
            raise DataError(f"{path}, line {line}: no assistant message, so nothing to learn.")
        rows.append({"messages": messages, **({"tools": row["tools"]} if row.get("tools") else {})})
    if len(rows) < minimum:
        raise DataError(f"{path} has {len(rows)} example(s); a fine-tuning job needs at least {minimum}.")
    return rows


# -- hyperparameters -> Gym's training keys ------------------------------------------------------------------------
def resolved_hyperparameters(spec: JobSpec, rows: int) -> dict[str, Any]:
    """Each "auto" replaced by its value for a file of `rows` examples (OpenAI reports them resolved)."""
    hyper = spec.hyperparameters
    # A batch larger than the file is the whole file: reported as the size trained with (and the memory estimate
    # that picks gradient checkpointing reads it too), not as asked.
    batch = min(int(hyper.batch_size), rows) if hyper.batch_size != "auto" else max(1, min(8, rows // 8))
    epochs = hyper.n_epochs if hyper.n_epochs != "auto" else min(MAX_AUTO_EPOCHS,
                                                                  max(3, math.ceil(TARGET_EXAMPLES / rows)))
    multiplier = hyper.learning_rate_multiplier if hyper.learning_rate_multiplier != "auto" else 1.0
    resolved: dict[str, Any] = {"n_epochs": epochs, "batch_size": batch, "learning_rate_multiplier": multiplier}
    if spec.method is Method.DPO:
        resolved["beta"] = hyper.beta if hyper.beta != "auto" else DEFAULT_BETA
    return resolved


def training_keys(spec: JobSpec, rows: int) -> dict[str, Any]:
    """Gym's training keys for the job: the resolved hyperparameters, the seed, a checkpoint per epoch (OpenAI
    keeps one per epoch too), then the operator's `training` keys on top."""
    resolved = resolved_hyperparameters(spec, rows)
    keys: dict[str, Any] = {
        "num_train_epochs": resolved["n_epochs"], "per_device_train_batch_size": resolved["batch_size"],
        "learning_rate": resolved["learning_rate_multiplier"] * BASE_LEARNING_RATE[spec.method.value],
        "seed": spec.seed, "logging_steps": 1, "save_strategy": "epoch",
        "save_total_limit": KEPT_CHECKPOINTS, "disable_tqdm": True, "report_to": "none",
        "include_num_input_tokens_seen": "non_padding",  # OpenAI's trained_tokens; kept in checkpoints too
    }
    if "beta" in resolved:
        keys["pref_beta"] = resolved["beta"]
    keys.update(spec.training)
    return keys


def _delta_config(method: str, options: dict[str, Any]) -> Any:
    """The delta compression a variant is stored with: BitDelta by default, or a DeltaQuant method."""
    from gym.personalization import BitDeltaConfig, DeltaQuantConfig  # the variant job's options (gym.delta's)

    if not isinstance(options, dict):
        raise ConfigError(f"delta_options must be an object, got {type(options).__name__}.")
    try:
        if method == "bitdelta":
            return BitDeltaConfig(**{"distill_steps": 50, "calibration": "user-rows", **options})
        return DeltaQuantConfig(method=method, **options)
    except TypeError as exc:  # an unknown option
        said = str(exc)  # UnknownField ends its own sentence ("Did you mean 'distill_steps'?")
        raise ConfigError(f"delta_options for {method}: {said}{'' if said.endswith(('.', '?')) else '.'}") from None


def _safety_gate(values: dict[str, Any] | None) -> Any:
    """The operator's safety gate (gym.safety.gate.SafetyGate), or None; bad options fail naming them."""
    if values is None:
        return None
    from gym.safety.gate import SafetyGate

    return SafetyGate.from_dict(values)


# -- running -------------------------------------------------------------------------------------------------------
@dataclass
class JobResult:
    """How a job ended. `error` is OpenAI's error object ({"code", "message", "param"}) when it failed."""

    job_id: str
    status: JobStatus
    fine_tuned_model: str | None = None
    variant: str | None = None
    trained_steps: int = 0
    trained_tokens: int | None = None  # tokens the training read (padding excluded), every epoch counted
    resumed_from_step: int | None = None
    gain_kept: float | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None


def _error(exc: GymError) -> dict[str, Any]:
    from gym.safety.gate import SafetyGateRefused

    if isinstance(exc, SafetyGateRefused):  # the model trained, and was refused: the message holds the numbers
        return {"code": "safety_gate_refused", "message": str(exc), "param": None}
    code = "invalid_training_file" if isinstance(exc, DataError) else \
        "invalid_request" if isinstance(exc, ConfigError) else "training_failed"
    return {"code": code, "message": str(exc), "param": "training_file" if isinstance(exc, DataError) else None}


def _as_the_client_names_it(text: str, spec: JobSpec, store_dir: str | Path | None = None,
                            work_dir: str | Path | None = None) -> str:
    """The server's paths of the job's files as their ids (file-...): what the tenant uploaded and knows, not where
    the server keeps it; the job's folder as the job id, the base's folder as the model's name, every other path
    of the server's hidden (hide_server_paths)."""
    folders: list[tuple[str | Path, str, bool]] = [
        (path, Path(path).name, False) for path in (spec.training_file, getattr(spec, "validation_file", None))
        if path]
    if work_dir is not None:
        folders.append((work_dir, str(getattr(spec, "job_id", "the job's folder")), True))
    base_path = getattr(spec, "base_path", None)
    if base_path and Path(base_path).expanduser().exists():
        folders.append((base_path, str(spec.model), False))
    if store_dir is not None:
        folders.append((store_dir, "the variant store", False))
    return str(hide_server_paths(text, folders))


def run_job(spec: JobSpec, store_dir: str | Path, work_dir: str | Path, on_event: EventSink | None = None,
            cancel: Callable[[], bool] | Any | None = None) -> JobResult:
    """Run `spec` to its end: succeeded (its variant in the store at `store_dir`, the variant store of
    spec.model), failed (a user's error: the result carries it; a bug is raised after a failed event) or
    cancelled. `work_dir` is the job's own folder: run again on it after a crash, the job resumes. `cancel`: a
    callable or an event, checked between steps. A run stopped by a signal (SIGINT: the step finishes and a
    checkpoint is saved) raises RunStopped: the job has not ended, and a run on the same work_dir resumes it."""
    from gym.personalization.store import VariantStore

    emit: EventSink = on_event or (lambda level, message, data: None)
    cancelled = cancel_check(cancel)
    result = JobResult(job_id=getattr(spec, "job_id", "?"), status=JobStatus.RUNNING)
    try:
        spec.check()
        result.fine_tuned_model, result.variant = spec.fine_tuned_model, spec.variant
        store = VariantStore(store_dir)
        if store.exists(spec.variant):  # published before (a worker killed after it, or a job run twice)
            record = store.get(spec.variant)
            result.gain_kept, result.status = record.gain_kept, JobStatus.SUCCEEDED
            emit("info", "The job has successfully completed (its model was published before)",
                 {"fine_tuned_model": spec.fine_tuned_model})
            return result
        _train_and_publish(spec, store, Path(work_dir), emit, cancelled, result)
    except JobCancelled:
        result.status, result.fine_tuned_model, result.variant = JobStatus.CANCELLED, None, None
        emit("info", "Fine-tuning job cancelled", None)
    except RunStopped:
        # The process was asked to stop (Ctrl-C at a server's terminal reaches its workers too), not the job: it
        # has not ended, and its checkpoint, just saved, is what a run on the same work_dir resumes from.
        raise
    except Exception as exc:
        known = as_gym_error(exc)
        result.status, result.fine_tuned_model, result.variant = JobStatus.FAILED, None, None
        result.error = _error(known) if known is not None else {"code": "server_error", "message": str(exc),
                                                                "param": None}
        if known is not None:  # whole, for the operator (a bug is raised, and logged with its traceback)
            logger.warning("Job %s failed: %s", result.job_id, result.error["message"])
        result.error["message"] = _as_the_client_names_it(result.error["message"], spec, store_dir, work_dir)
        data: dict[str, Any] = {"error": result.error}
        decision = getattr(known, "decision", None)  # a safety gate's refusal: its numbers, as the event's data
        if decision is not None:
            data["safety_gate"] = decision.to_dict()
        emit("error", f"Fine-tuning job failed: {result.error['message']}", data)
        if known is None:
            raise  # a bug keeps its traceback; the event above already told the job's owner
    return result


def _train_and_publish(spec: JobSpec, store: Any, work: Path, emit: EventSink, cancelled: Callable[[], bool],
                       result: JobResult) -> None:
    from gym.personalization.trainer import CreationStopped, PersonalizedTrainer
    from gym.train.checkpoints import last_checkpoint
    from gym.train.harness import extra_callbacks
    from gym.train.installing import is_finished_output
    from gym.train.outputs import read_log

    emit("info", f"Validating training file: {Path(spec.training_file).name}", None)
    rows = read_training_file(spec.training_file, spec.method)
    held_out = None
    if spec.validation_file is not None:
        emit("info", f"Validating validation file: {Path(spec.validation_file).name}", None)
        validation = read_training_file(spec.validation_file, spec.method, minimum=1)
        held_out = validation if spec.method is Method.SUPERVISED else None  # dpo: the gain kept is SFT rows' only
    if cancelled():
        raise JobCancelled("cancelled before training")
    trained = len(rows)
    if held_out is None and spec.method is Method.SUPERVISED and len(rows) >= HELD_OUT_MIN_ROWS:
        rows = list(rows)  # a fifth (at most 20) held out to measure the gain kept, as `gym variants create` does
        random.Random(spec.seed).shuffle(rows)
        count = min(20, max(2, len(rows) // 5))
        held_out, rows = rows[:count], rows[count:]
        trained = len(rows)
    keys = training_keys(spec, trained)
    result.hyperparameters = resolved_hyperparameters(spec, trained)

    run_dir = work / RUN_FOLDER
    checkpoint = last_checkpoint(run_dir)
    if is_finished_output(run_dir):
        keys["resume_from_checkpoint"] = True  # training finished before the interruption: only publishing is left
        emit("info", "Training had finished before the interruption; publishing the model", None)
    elif checkpoint is not None:
        keys["resume_from_checkpoint"] = True
        result.resumed_from_step = int(checkpoint.name.split("-")[-1])
        emit("info", f"Resuming from {checkpoint.name} (step {result.resumed_from_step})",
             {"step": result.resumed_from_step, "checkpoint": checkpoint.name})
    emit("info", "Fine-tuning job started", {"hyperparameters": result.hyperparameters})

    progress: dict[str, Any] = {}
    trainer = PersonalizedTrainer(spec.base_path or spec.model, _delta_config(spec.delta_method, spec.delta_options),
                                  store=store.root)
    gate = _safety_gate(spec.safety_gate)
    with extra_callbacks(job_callback(emit, cancelled, progress)):
        try:
            if spec.method is Method.DPO:
                record = trainer.create_variant(spec.variant, preferences=rows, work_dir=work, safety_gate=gate,
                                                should_stop=cancelled, **keys)
            else:
                record = trainer.create_variant(spec.variant, data=rows, work_dir=work, held_out=held_out,
                                                safety_gate=gate, should_stop=cancelled, **keys)
        except CreationStopped as stopped:  # cancelled after training: during compression, the gate or the gain
            raise JobCancelled(str(stopped)) from None
    steps = [int(e["step"]) for e in read_log(run_dir) if "loss" in e and "step" in e]
    result.trained_steps = max(steps, default=progress.get("step", 0))
    # the count seen by the end (restored from the checkpoint on a resume); absent where the trainer could not
    # tell its input tokens apart (then it is left unknown rather than guessed)
    tokens = [int(e["num_input_tokens_seen"]) for e in read_log(run_dir) if e.get("num_input_tokens_seen")]
    result.trained_tokens = max(tokens, default=None)
    result.gain_kept = record.gain_kept
    if record.gain_kept is not None:
        emit("info", f"The stored {record.method} variant keeps {record.gain_kept:.0%} of the fine-tune's loss gain "
             f"on {len(held_out or [])} held-out rows", {"gain_kept": record.gain_kept, "losses": record.losses})
    if record.safety_gate is not None:
        emit("info", f"Safety gate passed: harmful compliance on {record.safety_gate['set']} went from "
             f"{record.safety_gate['base_rate']:.1%} to {record.safety_gate['candidate_rate']:.1%}",
             {"safety_gate": record.safety_gate})
    result.status = JobStatus.SUCCEEDED
    emit("info", "The job has successfully completed", {"fine_tuned_model": spec.fine_tuned_model,
                                                        "trained_steps": result.trained_steps,
                                                        "trained_tokens": result.trained_tokens})


__all__ = ["FineTunedModel", "Hyperparameters", "JobResult", "JobSpec", "JobStatus", "Method",
           "check_job_options", "new_job_id", "parse_fine_tuned_model",
           "read_training_file", "run_job", "training_keys"]
