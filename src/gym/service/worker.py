"""Job workers: processes that take queued fine-tuning jobs from the store's database and run them.

    python -m gym.service.worker STORE [--base MODEL] [--options JSON]      (--db: $GYM_SERVICE_DB)

`gym api --variants STORE --train-workers N` starts N of them (WorkerPool) beside the server. Each is a process of
its own, at SCHED_IDLE (`nice`d where that is not available), with one compute thread (OMP_NUM_THREADS=1), so
training never takes the cores serving answers with (bench/service_load.py: nice alone let a trainer cut a 2-core
server's throughput 12x; SCHED_IDLE kept it, docs/benchmarks.md). A worker claims the oldest queued job in a
write transaction (gym.service.queue), runs it with gym.service.jobs.run_job (events become rows as they come; a
thread keeps the heartbeat fresh and reads the job's cancel request), records how it ended, removes the job's
folder and takes the next.

A worker killed at any point (even -9, the whole server with it) leaves its job `running` with a dead process
and a stale heartbeat: the next server start (or the pool, when a worker exits) puts it back in the queue with an
event, and run_job, run again on the same work folder (`STORE/.service/jobs/<id>`), resumes from its last
checkpoint and publishes the model once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, RunStopped
from gym.service.db import DatabaseUnavailable, JobStatus
from gym.service.queue import Claimed, JobQueue, worker_id

logger = logging.getLogger(__name__)

DB_ENV = "GYM_SERVICE_DB"  # the database URL reaches workers in their environment, not on a command line ps shows
HEARTBEAT_SECONDS = 5.0
POLL_SECONDS = 1.0
NICENESS = 10


def run_one(queue: JobQueue, claimed: Claimed, me: str) -> str:
    """Run one claimed job to its end and record it; -> the status it ended with."""
    from gym.service.jobs import run_job

    spec = claimed.spec
    cancel, done = threading.Event(), threading.Event()

    def beat() -> None:  # the heartbeat says this worker lives; the same read brings the owner's cancel
        while not done.wait(HEARTBEAT_SECONDS):
            try:
                if queue.beat(spec.job_id, me):
                    cancel.set()
            except DatabaseUnavailable:
                logger.warning("Job %s: the database is unavailable; heartbeat skipped", spec.job_id)

    thread = threading.Thread(target=beat, name=f"heartbeat-{spec.job_id}", daemon=True)
    thread.start()
    try:
        result = run_job(spec, queue.store, claimed.work_dir,
                         on_event=lambda level, message, data: queue.add_event(spec.job_id, level, message, data),
                         cancel=lambda: cancel.is_set() or _cancel_requested(queue, spec.job_id, me, cancel))
        status = result.status.value
        queue.finish(spec.job_id, me, status, fine_tuned_model=result.fine_tuned_model, error=result.error,
                     result={"hyperparameters": result.hyperparameters, "trained_steps": result.trained_steps,
                             "trained_tokens": result.trained_tokens})
    except RunStopped:  # this worker was told to stop: the job stays running, its folder kept for the resume
        raise
    except Exception as exc:  # a bug in training: run_job emitted the failed event; the job fails, the worker goes on
        logger.exception("Job %s failed", spec.job_id)
        status = JobStatus.FAILED.value
        queue.finish(spec.job_id, me, status, error={"code": "server_error", "message": str(exc), "param": None})
    finally:
        done.set()
        thread.join()
    shutil.rmtree(claimed.work_dir, ignore_errors=True)  # ended: nothing in it will be resumed
    return status


def _cancel_requested(queue: JobQueue, job_id: str, me: str, cancel: threading.Event) -> bool:
    """The database's answer now, not the heartbeat's of up to 5 s ago: asked at each step's end and before the
    variant is stored, where a cancel that arrived since the last beat would otherwise publish the model."""
    try:
        if queue.beat(job_id, me):
            cancel.set()
    except DatabaseUnavailable:
        pass  # the heartbeat thread says so; the last answer stands
    return cancel.is_set()


def serve_jobs(queue: JobQueue, base_path: str | None, options: dict[str, Any], *,
               stop: threading.Event | None = None) -> None:
    """Claim and run jobs until `stop` is set (or forever)."""
    me = worker_id()
    while stop is None or not stop.is_set():
        try:
            claimed = queue.claim(me, base_path, options)
        except DatabaseUnavailable as exc:
            logger.warning("%s; retrying", exc)
            claimed = None
        if claimed is None:
            time.sleep(POLL_SECONDS)
            continue
        logger.info("Worker %s runs job %s (attempt %d)", me, claimed.spec.job_id, claimed.attempt)
        run_one(queue, claimed, me)


class WorkerPool:
    """N worker processes for the server: started with it, restarted if one dies, stopped with it. Workers share
    the server's process group, so killing the group (kill -9 included) takes them too."""

    def __init__(self, queue: JobQueue, count: int, *, db_url: str | None, base_path: str | None,
                 options: dict[str, Any] | None = None) -> None:
        if count < 0:
            raise ConfigError(f"--train-workers {count}: give 0 or more.")
        self.queue, self.count, self.db_url, self.base_path = queue, count, db_url, base_path
        self.options = options or {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        requeued = self.queue.requeue_dead()  # jobs a killed server's workers left running
        if requeued:
            logger.info("Re-queued %d job(s) left running by stopped workers: %s", len(requeued), ", ".join(requeued))
        swept = self.queue.remove_ended_work_dirs()  # a worker stopped between a job's end and its clean-up
        if swept:
            logger.info("Removed the folders of %d ended job(s): %s", len(swept), ", ".join(swept))
        self.processes = [self._spawn() for _ in range(self.count)]
        if self.count:
            self._watch = threading.Thread(target=self._watch_workers, name="job-workers", daemon=True)
            self._watch.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.db_url is not None:
            env[DB_ENV] = self.db_url
        command = [sys.executable, "-m", "gym.service.worker", str(self.queue.store),
                   "--options", json.dumps(self.options)]
        if self.base_path is not None:
            command += ["--base", self.base_path]
        return subprocess.Popen(command, env=env)

    def _watch_workers(self) -> None:
        """A worker that died (out of memory, a crash) is replaced, and its job queued again to resume."""
        while not self._stop.wait(HEARTBEAT_SECONDS):
            for i, process in enumerate(self.processes):
                if process.poll() is not None and not self._stop.is_set():
                    logger.warning("Job worker %d exited with status %s; starting another", process.pid,
                                   process.returncode)
                    with contextlib.suppress(DatabaseUnavailable):  # the next start re-queues it then
                        self.queue.requeue_dead()
                    self.processes[i] = self._spawn()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the workers; a job they were running stays `running` and is re-queued at the next start."""
        self._stop.set()
        for process in self.processes:
            process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def lower_priority() -> None:
    """Serving first: under SCHED_IDLE the kernel runs this process only on a core nothing else wants. `nice` alone
    is not enough: the server's decode threads wait on each other every step, so one of them descheduled for the
    trainer holds the whole batch back."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: the weaker lever
        with contextlib.suppress(OSError):
            os.nice(NICENESS)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gym.service.worker", description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--base", default=None, help="the base model to train from (a Gym name or a folder)")
    parser.add_argument("--options", default="{}", help="JSON: the operator's training, delta_method, delta_options")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [worker %(process)d] %(message)s")
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--options: not JSON ({exc.msg}).") from None
    lower_priority()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    from gym.service.service import open_service

    service = open_service(Path(args.store), os.environ.get(DB_ENV) or None)
    import signal

    stop = threading.Event()
    # SIGTERM from the pool: finish nothing, just end (the job is re-queued and resumes from its checkpoint)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve_jobs(service.jobs, args.base, options, stop=stop)
    except (RunStopped, KeyboardInterrupt):  # Ctrl-C: the job is re-queued, as after SIGTERM, and resumes
        logger.info("Stopped; the job it ran resumes from its last checkpoint at the next start")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
