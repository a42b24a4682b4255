"""The fine-tuning job queue: jobs and their events as rows of the store's database (OpenAI's fine-tuning API).

The routes (gym.serve.fine_tuning) create, list, read and cancel jobs here; workers (gym.service.worker) claim
them, record their events and their end. Every state change is one transaction, so a server and its workers (and
replicas sharing a PostgreSQL database) agree on who runs what:

    validating_files -> queued -> running -> succeeded | failed | cancelled
                          ^          |
                          +----------+  a worker that died (its process gone, or no heartbeat for STALE_SECONDS)

Quotas are per user: at most `max_queued` jobs waiting (validating_files or queued: a creation beyond it is
refused, and nothing is stored), and at most `max_running` running at once (a worker skips that user's next job
until one ends).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update

from gym.core.errors import ConfigError, GymError
from gym.core.names import did_you_mean
from gym.service.db import Database, Job, JobEvent, JobStatus, StoredFile, now
from gym.service.events import hide_server_paths, openai_event
from gym.service.files import FileNotFound, FileStore
from gym.service.jobs import (
    JOB_PREFIX,
    KEPT_CHECKPOINTS,
    MIN_ROWS,
    Hyperparameters,
    JobSpec,
    Method,
    parse_fine_tuned_model,
)
from gym.service.keys import Principal
from gym.service.limits import JobLimits

logger = logging.getLogger(__name__)

JOBS_DIR = Path(".service") / "jobs"
ADMIN_OWNER = "admin"  # the user part of the model name of a job made with an admin's key (which has no user)
STALE_SECONDS = 120  # a running job whose heartbeat is older than this was left by a dead worker
WAITING = (JobStatus.VALIDATING_FILES.value, JobStatus.QUEUED.value)
ENDED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)
_KIND = {Method.SUPERVISED: "chat", Method.DPO: "preference"}


class JobNotFound(GymError):
    """No such job, or one the caller may not see (the same answer: another user's job is not there for them)."""


class QuotaExceeded(GymError):
    """The caller already has as many jobs waiting as the server allows (HTTP 429)."""


class JobFinished(GymError):
    """A cancel for a job that has already ended."""


@dataclass(frozen=True)
class Claimed:
    """A job a worker took: its spec (files as paths) and its own folder."""

    spec: JobSpec
    work_dir: Path
    attempt: int


class JobQueue:
    def __init__(self, store_dir: str | Path, db: Database, files: FileStore, limits: JobLimits | None = None) -> None:
        self.store = Path(store_dir).expanduser()
        self.db = db
        self.files = files
        self.limits = limits or JobLimits()

    def work_dir(self, job_id: str) -> Path:
        return self.store / JOBS_DIR / job_id

    def for_client(self, job_id: str, value: Any) -> Any:
        """`value` (an error message, an event's data) with no path of the server's in it: what the job's owner
        reads. Every message a worker records passes here, a bug's traceback text included (run_job hides what it
        knows of, but an exception it re-raises reaches the worker as it was)."""
        return hide_server_paths(value, [(self.work_dir(job_id), job_id, True), (self.files.root, "", True),
                                         (self.store / JOBS_DIR, "the jobs' folder", False),
                                         (self.store, "the variant store", False)])

    # -- the routes' side ------------------------------------------------------------------------------------------
    def create(self, who: Principal, *, model: str, training_file: str, validation_file: str | None = None,
               method: dict[str, Any] | None = None, hyperparameters: dict[str, Any] | None = None,
               suffix: str | None = None, seed: int | None = None,
               metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new job for `who` on `model` (the served base, checked by the caller): validating_files, then queued
        once its files are the caller's and of the method's format. FileNotFound for a file the caller may not
        see, ConfigError for a bad value, QuotaExceeded past the caller's waiting jobs."""
        kind, hyper = _method(method, hyperparameters)
        labels = check_metadata(metadata)
        job_id = ordered_job_id()
        # Every rule of the spec is checked now, so a job that cannot run is refused instead of queued.
        spec = JobSpec(job_id=job_id, user_id=who.user_id or ADMIN_OWNER, model=model, training_file=training_file,
                       validation_file=validation_file, method=Method(kind),
                       hyperparameters=Hyperparameters.from_dict(hyper), suffix=suffix or "",
                       seed=42 if seed is None else seed)
        with self.db.session(write=True) as session:
            self.db.lock(session, f"jobs:{who.user_id}")  # two creations at once cannot both pass the quota
            waiting = session.scalar(select(func.count()).select_from(Job).where(
                Job.user_id == who.user_id, Job.status.in_(WAITING))) or 0
            if who.user_id is not None and waiting >= self.limits.max_queued:
                raise QuotaExceeded(f"You have {waiting} fine-tuning jobs waiting, the most this server queues per "
                                    "user; wait for one to start, or cancel one.")
            names = {"training_file": training_file, "validation_file": validation_file}
            found: dict[str, StoredFile] = {}
            for param, file_id in names.items():
                row = session.get(StoredFile, file_id) if file_id is not None else None
                if file_id is not None and (row is None or not who.may_see(row.user_id)):
                    raise FileNotFound(f"No such file: {file_id!r} ({param}).")
                if row is not None:
                    found[param] = row
            job = Job(id=job_id, user_id=who.user_id, model=model, training_file=training_file,
                      validation_file=validation_file, method=_method_object(spec), suffix=suffix, seed=spec.seed,
                      status=JobStatus.VALIDATING_FILES.value, created_at=now(), labels=labels)
            session.add(job)
            session.add(JobEvent(job_id=job_id, message="Validating training file", created_at=now()))
            wrong = next((p for p, f in found.items() if f.kind != _KIND[spec.method]), None)
            problem = (f"{wrong} {names[wrong]} holds {found[wrong].kind} rows; a {spec.method.value} job needs "
                       f"{_KIND[spec.method]} rows.") if wrong is not None else None
            if problem is None and found["training_file"].rows < MIN_ROWS:  # the count was taken on upload
                wrong, problem = "training_file", (f"training_file {training_file} has {found['training_file'].rows} "
                                                   f"example(s); a fine-tuning job needs at least {MIN_ROWS}.")
            if problem is None:
                job.status = JobStatus.QUEUED.value
                session.add(JobEvent(job_id=job_id, message="Files validated, job queued", created_at=now()))
            else:  # the file uploaded fine, just not for a job: the job fails at once, as OpenAI's does
                job.status, job.finished_at = JobStatus.FAILED.value, now()
                job.error = {"code": "invalid_training_file", "param": wrong, "message": problem}
                session.add(JobEvent(job_id=job_id, level="error", message=problem, created_at=now()))
            session.flush()
            return job_object(job)

    def list_jobs(self, who: Principal) -> list[dict[str, Any]]:
        """The jobs `who` may see, newest first."""
        query = select(Job).order_by(Job.id.desc())
        if not who.admin:
            query = query.where(Job.user_id == who.user_id)
        with self.db.session() as session:
            return [job_object(row) for row in session.scalars(query)]

    def get(self, who: Principal, job_id: str) -> dict[str, Any]:
        with self.db.session() as session:
            return job_object(self._row(session, who, job_id))

    def cancel(self, who: Principal, job_id: str) -> dict[str, Any]:
        """A waiting job is cancelled at once; a running one is asked to stop (its worker does so between two
        steps, and no model is published). An ended job: JobFinished."""
        with self.db.session(write=True) as session:
            job = self._row(session, who, job_id)
            if job.status in ENDED:
                raise JobFinished(f"Job {job_id} has already ended ({job.status}).")
            if job.status == JobStatus.RUNNING.value:
                job.cancel_requested = True
                session.add(JobEvent(job_id=job_id, message="Cancellation requested", created_at=now()))
            else:
                job.status, job.finished_at = JobStatus.CANCELLED.value, now()
                session.add(JobEvent(job_id=job_id, message="Fine-tuning job cancelled", created_at=now()))
            session.flush()
            return job_object(job)

    def events(self, who: Principal, job_id: str) -> list[dict[str, Any]]:
        """The job's events in OpenAI's shape, newest first (as OpenAI lists them)."""
        with self.db.session() as session:
            self._row(session, who, job_id)
            rows = list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)
                                        .order_by(JobEvent.id.desc())))
            return [event_object(row, len(rows) - i) for i, row in enumerate(rows)]

    def checkpoints(self, who: Principal, job_id: str) -> list[dict[str, Any]]:
        """OpenAI's checkpoint objects, newest first: one per "Checkpoint created" event, with the metrics of its
        step, the last KEPT_CHECKPOINTS of them as OpenAI keeps the last three epochs' (and a job keeps on disk,
        save_total_limit). Their `fine_tuned_model_checkpoint` names are informative: checkpoints are not served."""
        events = self.events(who, job_id)
        with self.db.session() as session:
            job = self._row(session, who, job_id)
            owner = job.user_id or ADMIN_OWNER
            base = f"ft:{job.model}:{owner}:{job.suffix or ''}:{job.id.removeprefix('ftjob-')}"
        losses = {e["data"]["step"]: e["data"] for e in events if e["type"] == "metrics"}
        found: dict[int, dict[str, Any]] = {}
        for event in events:
            data = event["data"]
            if "checkpoint" not in data or "step" not in data or not event["message"].startswith("Checkpoint"):
                continue
            step = int(data["step"])
            if step in found:  # saved again after a restart: the newest one stands
                continue
            metrics = losses.get(step, {})
            found[step] = {"object": "fine_tuning.job.checkpoint",
                           "id": f"ftckpt-{job_id.removeprefix('ftjob-')}-{step}", "created_at": event["created_at"],
                           "fine_tuned_model_checkpoint": f"{base}:ckpt-step-{step}",
                           "step_number": step, "fine_tuning_job_id": job_id,
                           "metrics": {"step": step, **({"train_loss": metrics["train_loss"]} if metrics else {})}}
        newest_first = sorted(found.values(), key=lambda c: -int(c["step_number"]))
        return newest_first[:KEPT_CHECKPOINTS]

    def owner_of_model(self, name: str) -> tuple[bool, str | None]:
        """Whether `name` is the fine-tuned model of a job that succeeded, and its owner (the job's user)."""
        try:
            parsed = parse_fine_tuned_model(name)
        except ConfigError:
            return False, None
        with self.db.session() as session:
            job = session.get(Job, parsed.job_id)
            if job is None or job.status != JobStatus.SUCCEEDED.value or job.fine_tuned_model != name:
                return False, None
            return True, job.user_id

    def fine_tuned_models(self) -> dict[str, str | None]:
        """Every succeeded job's model name -> its owner."""
        with self.db.session() as session:
            return {name: owner for name, owner in session.execute(select(Job.fine_tuned_model, Job.user_id).where(
                Job.status == JobStatus.SUCCEEDED.value, Job.fine_tuned_model.is_not(None))) if name}

    def _row(self, session: Any, who: Principal, job_id: str) -> Job:
        job = session.get(Job, job_id)
        if job is None or not who.may_see(job.user_id):
            raise JobNotFound(f"No such fine-tuning job: {job_id!r}.")
        return job

    # -- the workers' side -----------------------------------------------------------------------------------------
    def claim(self, worker_id: str, base_path: str | None = None,
              options: dict[str, Any] | None = None) -> Claimed | None:
        """Take the oldest queued job whose owner has fewer than `max_running` running: running, this worker's,
        heartbeat now. None when there is nothing to take. `options`: the operator's training, delta_method,
        delta_options and safety_gate for every job."""
        options = options or {}
        with self.db.session(write=True) as session:
            self.db.lock(session, "jobs:claim")
            running = dict(session.execute(select(Job.user_id, func.count()).where(
                Job.status == JobStatus.RUNNING.value).group_by(Job.user_id)).all())
            for job in session.scalars(select(Job).where(Job.status == JobStatus.QUEUED.value)
                                       .order_by(Job.id).limit(256)):
                if running.get(job.user_id, 0) >= self.limits.max_running:
                    continue
                validation = str(self.files.path(job.validation_file)) if job.validation_file else None
                try:
                    spec = JobSpec(job_id=job.id, user_id=job.user_id or ADMIN_OWNER, model=job.model,
                                   training_file=str(self.files.path(job.training_file)), validation_file=validation,
                                   method=Method((job.method or {}).get("type", "supervised")),
                                   hyperparameters=Hyperparameters.from_dict(_hyper_of(job.method)),
                                   suffix=job.suffix or "",
                                   seed=42 if job.seed is None else job.seed, base_path=base_path,
                                   training=dict(options.get("training") or {}),
                                   delta_method=options.get("delta_method", "bitdelta"),
                                   delta_options=dict(options.get("delta_options") or {}),
                                   safety_gate=options.get("safety_gate"))
                except ConfigError as exc:
                    # Queued under older, looser rules (a seed or n_epochs now out of range): failed here, or it
                    # would stay the oldest queued job and stop every worker's claim, and the queue, for good.
                    logger.warning("Job %s failed when claimed: %s", job.id, exc)
                    said = self.for_client(job.id, str(exc))
                    job.status, job.finished_at = JobStatus.FAILED.value, now()
                    job.error = {"code": "invalid_request", "param": None, "message": said}
                    session.add(JobEvent(job_id=job.id, level="error", message=f"Fine-tuning job failed: {said}",
                                         created_at=now()))
                    continue
                job.status, job.worker_id, job.heartbeat = JobStatus.RUNNING.value, worker_id, now()
                job.started_at = job.started_at or now()
                job.attempts += 1
                return Claimed(spec=spec, work_dir=self.work_dir(job.id), attempt=job.attempts)
        return None

    def add_event(self, job_id: str, level: str, message: str, data: dict[str, Any] | None) -> None:
        shown, shown_data = self.for_client(job_id, message), self.for_client(job_id, data)
        if shown != message:
            logger.info("Job %s: %s", job_id, message)  # the operator's log keeps the paths the owner does not see
        with self.db.session() as session:
            session.add(JobEvent(job_id=job_id, level=level, message=shown, data=shown_data, created_at=now()))

    def beat(self, job_id: str, worker_id: str) -> bool:
        """Refresh the job's heartbeat; True when its cancel was requested (or it is no longer this worker's)."""
        with self.db.session() as session:
            session.execute(update(Job).where(Job.id == job_id, Job.worker_id == worker_id)
                            .values(heartbeat=now()))
            job = session.get(Job, job_id)
            return job is None or job.cancel_requested or job.worker_id != worker_id

    def finish(self, job_id: str, worker_id: str, status: str, *, fine_tuned_model: str | None = None,
               error: dict[str, Any] | None = None, result: dict[str, Any] | None = None) -> None:
        with self.db.session(write=True) as session:
            job = session.get(Job, job_id)
            if job is None or job.worker_id != worker_id or job.status != JobStatus.RUNNING.value:
                return  # re-queued meanwhile (this worker was thought dead): the job is another worker's now
            job.status, job.finished_at, job.heartbeat = status, now(), now()
            job.fine_tuned_model, job.error, job.result = fine_tuned_model, self.for_client(job_id, error), result

    def remove_ended_work_dirs(self) -> list[str]:
        """Remove the folders of jobs that have ended; -> their ids. A worker removes its job's folder once it has
        recorded the end, but one stopped in between (the server stopping, kill -9) leaves it behind, checkpoints
        and all, and nothing would read it again."""
        root = self.store / JOBS_DIR
        names = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        if not names:
            return []
        with self.db.session() as session:
            ended = sorted(session.scalars(select(Job.id).where(Job.id.in_(names), Job.status.in_(ENDED))))
        for job_id in ended:
            shutil.rmtree(root / job_id, ignore_errors=True)
        return ended

    def requeue_dead(self, alive: Any = None) -> list[str]:
        """Put back in the queue the running jobs whose worker is gone: a worker of this host whose process no
        longer exists, or any whose heartbeat is older than STALE_SECONDS. `alive(worker_id) -> bool|None`
        overrides the process check (None: unknown, the heartbeat decides). Each gets a restart event."""
        alive = alive or _process_alive
        requeued = []
        with self.db.session(write=True) as session:
            self.db.lock(session, "jobs:claim")
            for job in session.scalars(select(Job).where(Job.status == JobStatus.RUNNING.value)):
                live = alive(job.worker_id or "")
                if live is True or (live is None and now() - (job.heartbeat or 0) < STALE_SECONDS):
                    continue
                job.status, job.worker_id, job.heartbeat = JobStatus.QUEUED.value, None, None
                if job.cancel_requested:  # it was to stop anyway: do not train it again
                    job.status, job.finished_at = JobStatus.CANCELLED.value, now()
                    session.add(JobEvent(job_id=job.id, message="Fine-tuning job cancelled", created_at=now()))
                else:
                    session.add(JobEvent(job_id=job.id, message="The worker running this job stopped; the job is "
                                         "queued again and resumes from its last checkpoint",
                                         data={"restart": job.attempts}, created_at=now()))
                requeued.append(job.id)
        return requeued


def ordered_job_id() -> str:
    """A job id that sorts by creation time (nanoseconds, then random bits): "oldest queued" and "newest first" are
    an order by id, even for jobs made within the same second."""
    return f"{JOB_PREFIX}{time.time_ns():016x}{secrets.token_hex(4)}"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _process_alive(worker: str) -> bool | None:
    """Whether the worker `host:pid` is a live process; None for another host's (only its heartbeat tells)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not a live worker
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def _method(method: dict[str, Any] | None, legacy: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """OpenAI's `method` ({"type": "supervised", "supervised": {"hyperparameters": {...}}}) or the legacy top-level
    `hyperparameters` -> (method name, hyperparameters)."""
    if method is None:
        return "supervised", dict(legacy or {})
    if not isinstance(method, dict) or not isinstance(method.get("type"), str):
        raise ConfigError("method: give {\"type\": \"supervised\" | \"dpo\", ...}.")
    kind = method["type"]
    if kind not in ("supervised", "dpo"):
        raise ConfigError(f"method.type {kind!r}: use supervised or dpo.")
    # A misspelt or mismatched key would otherwise be dropped with the hyperparameters under it, and the job would
    # train with "auto" ones without a word.
    fields = ("type", *(m.value for m in Method))
    for key in method:
        if key not in fields:
            raise ConfigError(f"method.{key} is not a field of method.{did_you_mean(str(key), fields)}")
        if key not in ("type", kind):
            raise ConfigError(f"method.{key} is given but method.type is {kind!r}; put the hyperparameters under "
                              f"method.{kind}, or set method.type to {key!r}.")
    inner = method.get(kind) or {}
    if not isinstance(inner, dict):
        raise ConfigError(f"method.{kind}: give an object with hyperparameters.")
    for key in inner:
        if key != "hyperparameters":
            raise ConfigError(f"method.{kind}.{key} is not a field of method.{kind} (it takes hyperparameters)."
                              f"{did_you_mean(str(key), ['hyperparameters'])}")
    hyper = inner.get("hyperparameters") or {}
    if not isinstance(hyper, dict):
        raise ConfigError(f"method.{kind}.hyperparameters: give an object.")
    if legacy and hyper:
        raise ConfigError("Give hyperparameters either in method or at the top level, not both.")
    return kind, dict(hyper or legacy or {})


def _method_object(spec: JobSpec) -> dict[str, Any]:
    kind = spec.method.value
    hyperparameters = dict(vars(spec.hyperparameters))
    if spec.method is not Method.DPO:
        hyperparameters.pop("beta", None)  # a dpo hyperparameter: OpenAI's supervised method has none
    return {"type": kind, kind: {"hyperparameters": hyperparameters}}


MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits


def check_metadata(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    """A job's `metadata` as OpenAI takes it: at most 16 pairs, string keys of at most 64 characters and string
    values of at most 512; a ConfigError naming the first pair that breaks a rule."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ConfigError("metadata: an object of string keys and values.")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ConfigError(f"metadata: at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}.")
    for key, value in metadata.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_METADATA_KEY:
            raise ConfigError(f"metadata: key {key!r} must be a string of 1 to {MAX_METADATA_KEY} characters.")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE:
            raise ConfigError(f"metadata.{key}: the value must be a string of at most {MAX_METADATA_VALUE} "
                              "characters.")
    return dict(metadata)


def _hyper_of(method: dict[str, Any] | None) -> dict[str, Any]:
    method = method or {"type": "supervised"}
    hyper = dict((method.get(method["type"]) or {}).get("hyperparameters") or {})
    if method["type"] != "dpo":
        hyper.pop("beta", None)
    return hyper


def job_object(job: Job) -> dict[str, Any]:
    """OpenAI's fine_tuning.job; hyperparameters resolved once the job has run (as OpenAI reports them)."""
    method = job.method or {"type": "supervised", "supervised": {"hyperparameters": {}}}
    resolved = (job.result or {}).get("hyperparameters")
    hyper = resolved or _hyper_of(method)
    if resolved:
        method = {"type": method["type"], method["type"]: {"hyperparameters": resolved}}
    return {"object": "fine_tuning.job", "id": job.id, "created_at": job.created_at, "model": job.model,
            "training_file": job.training_file, "validation_file": job.validation_file, "status": job.status,
            "fine_tuned_model": job.fine_tuned_model, "finished_at": job.finished_at, "error": job.error,
            "hyperparameters": hyper, "method": method, "seed": job.seed, "suffix": job.suffix,
            "organization_id": job.user_id or ADMIN_OWNER, "result_files": [], "integrations": [],
            "trained_tokens": (job.result or {}).get("trained_tokens"), "estimated_finish": None,
            "metadata": job.labels,
            "user_provided_suffix": job.suffix}


def event_object(row: JobEvent, number: int) -> dict[str, Any]:
    """`number`: the event's place in its own job (1 for the first). The id counts that job's events only: the
    database's row id counts every user's, and would tell one user how busy the others' jobs are."""
    event = openai_event(row.level, row.message, row.data, created_at=row.created_at)
    event["id"] = f"ftevent-{row.job_id.removeprefix(JOB_PREFIX)}-{number}"
    return event
