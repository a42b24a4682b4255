"""The web UI's jobs: `gym <verb> ...` subprocesses whose state lives on disk, so that a page reload, a second
tab or a restarted server finds them again.

Each job is a folder under the runs folder (`gym webui --runs_dir`, default saves/webui):

    <id>/job.json      what was run: kind, title, the command as a user would type it, argv, pid
    <id>/config.yaml   the YAML it runs (training, export, evaluation), the same file a user could run, less its
                       credentials: a Hugging Face token reaches the job's process as HF_TOKEN, never a file here
    <id>/console.log   everything the command printed
    <id>/exit_code     written by the supervisor when the command ends (absent while it runs)
    <id>/output/       what it writes (a training run's output_dir)
    <id>/uploads/      files given through the page, under sanitized names

The command runs under `python -m gym.webui.supervise <id>` in its own process group: the supervisor
outlives a server restart and records the exit code. Stop sends SIGINT to the group (a training run then
saves a checkpoint and exits 130; gym.train.stopping), and SIGTERM if it has not ended after a grace period.

The runs folder is served to the page (and to anyone who reaches it when the UI runs without --auth), so no
credential is written into it: the store keeps a job's token in memory and hands it to the job's process through
its environment. job.json names the variable, so a restarted server that no longer holds the token says so
instead of running the job without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, GymError, OutputError
from gym.core.files import pid_alive, temp_path

JOB_FILE, CONSOLE_FILE, EXIT_FILE, CONFIG_NAME = "job.json", "console.log", "exit_code", "config.yaml"
SUPERVISOR = "gym.webui.supervise"
STOP_GRACE_SECONDS = 60.0  # a checkpoint of a large model takes a while to write

# Config keys that are credentials -> the variable that carries them to the job's process instead: the Hugging Face
# libraries read HF_TOKEN whenever no token is passed (from_pretrained for hf_hub_token, push_to_hub for hub_token).
SECRET_KEYS = {"hf_hub_token": "HF_TOKEN", "hub_token": "HF_TOKEN"}
SECRET_ENV_META = "secret_env"  # job.meta: the names (never the values) of the variables a job needs

# exit status -> what the page says
STOPPED_CODES = {130, -signal.SIGINT, -signal.SIGTERM, 143}


@dataclass
class Job:
    id: str
    kind: str  # train, eval, export, delta, variants, soup, estimate
    title: str
    argv: list[str]
    folder: Path
    created: float
    pid: int | None = None
    output: str | None = None  # where its result goes (a training run's output_dir)
    meta: dict[str, Any] = field(default_factory=dict)
    # Set by the store that started it: its own child's state (not saved; before the child has exec'd the
    # supervisor, /proc would not show it yet).
    child_running: bool | None = field(default=None, compare=False)

    @property
    def command(self) -> str:
        """The command as a user types it: `gym train config.yaml`, not the interpreter's path."""
        if self.argv[1:3] == ["-m", "gym.cli"]:
            return shlex.join(["gym", *self.argv[3:]])
        return shlex.join(self.argv)

    @property
    def exit_code(self) -> int | None:
        try:
            return int((self.folder / EXIT_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    @property
    def status(self) -> str:
        code = self.exit_code
        if code is not None:
            return "finished" if code == 0 else "stopped" if code in STOPPED_CODES else "failed"
        if self.pid is None:
            return "created"
        if self.child_running is not None:
            return "running" if self.child_running else "lost"
        return "running" if _supervisor_alive(self.pid) else "lost"

    @property
    def running(self) -> bool:
        return self.status == "running"

    def console(self, lines: int = 80) -> str:
        """The last `lines` lines the command printed (a progress bar's carriage returns resolved)."""
        try:
            with (self.folder / CONSOLE_FILE).open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 256_000))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        shown = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
        return "\n".join(shown[-lines:])

    def label(self) -> str:
        return f"{self.id} · {self.title}"


def _supervisor_alive(pid: int) -> bool:
    """The job's supervisor is still running (and the pid was not reused by something else)."""
    if not pid_alive(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.is_file():
        try:
            return SUPERVISOR in cmdline.read_bytes().decode(errors="replace")
        except OSError:
            return False
    return True


def sanitize_name(name: str) -> str:
    """A file name safe to store: no folders, no leading dots, only [A-Za-z0-9._-], at most 100 characters."""
    base = re.split(r"[\\/]", name)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip(".")[:100]
    return base or "upload"


class JobStore:
    """Every job under `root`, newest first; starting, stopping and reading them."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            blocker = next((p for p in (self.root, *self.root.parents) if p.exists() and not p.is_dir()), self.root)
            raise OutputError(f"The runs folder {root}: {blocker} is a file, not a folder. Choose another "
                              "--runs_dir, or move the file.") from None
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # reaped here, so they never linger as zombies
        self._secrets: dict[str, dict[str, str]] = {}  # job id -> its credentials' variables; never on disk

    def create(self, kind: str, title: str, args: Sequence[str], config: dict[str, Any] | None = None,
               output: str | None = None, meta: dict[str, Any] | None = None) -> Job:
        """A new job folder; `args` is what follows `gym` ({config} stands for config.yaml's path, {job} for the
        job's folder)."""
        job_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        folder = self.root / job_id
        (folder / "uploads").mkdir(parents=True)
        config_path = folder / CONFIG_NAME
        argv = [sys.executable, "-m", "gym.cli",
                *(a.replace("{config}", str(config_path)).replace("{job}", str(folder)) for a in args)]
        job = Job(id=job_id, kind=kind, title=title, argv=argv, folder=folder, created=time.time(),
                  output=output.replace("{job}", str(folder)) if output else None, meta=meta or {})
        self._save(job)
        if config is not None:
            self.write_config(job, config)
        return job

    def write_config(self, job: Job, config: dict[str, Any]) -> Path:
        """config.yaml, less its credentials, which the job's process gets through its environment."""
        import yaml

        config, secrets_env = split_secrets(config)
        self._secrets[job.id] = secrets_env
        job.meta[SECRET_ENV_META] = sorted(secrets_env)
        if not secrets_env:
            del job.meta[SECRET_ENV_META]
        self._save(job)
        path = job.folder / CONFIG_NAME
        tmp = temp_path(path)
        tmp.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
        os.replace(tmp, path)
        return path

    def restart(self, job: Job, extra_args: Sequence[str] = ()) -> Job:
        """Run an ended job's command again in the same folder (e.g. with resume_from_checkpoint=true)."""
        if job.running:
            raise GymError(f"{job.id} is still running.")
        self._environment(job)  # before anything changes: a job that cannot get its token is left as it was
        (job.folder / EXIT_FILE).unlink(missing_ok=True)
        job.argv = [*[a for a in job.argv if a not in extra_args], *extra_args]
        return self.start(job)

    def upload(self, job: Job, source: str | Path, name: str | None = None) -> Path:
        """Copy a file the page received into the job's uploads folder under a sanitized name."""
        target = job.folder / "uploads" / sanitize_name(name or Path(source).name)
        target.write_bytes(Path(source).read_bytes())
        return target

    def _environment(self, job: Job) -> dict[str, str]:
        """The job process's environment: this server's, and the job's credentials where it was given any."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._secrets.get(job.id, {})}
        missing = [name for name in job.meta.get(SECRET_ENV_META, []) if not env.get(name)]
        if missing:
            raise GymError(f"{job.id} was given a Hugging Face token, which Gym never writes into the runs folder, and "
                           f"this server no longer holds it (it was restarted). Start gym webui with "
                           f"{' and '.join(missing)} set to run the job again.")
        return env

    def start(self, job: Job) -> Job:
        env = self._environment(job)
        # The supervisor runs the argv it reads from job.json, so the command (restart's extra_args, a caller's
        # change) must be on disk before it starts: saved only after Popen, a server slow to get the CPU back
        # let the supervisor run the previous command (a Resume without resume_from_checkpoint).
        self._save(job)
        console = (job.folder / CONSOLE_FILE).open("ab")
        try:
            proc = subprocess.Popen([sys.executable, "-m", SUPERVISOR, str(job.folder)], stdout=console,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=env)
        finally:
            console.close()
        self._children[job.id] = proc
        job.pid, job.child_running = proc.pid, True
        self._save(job)
        return job

    def stop(self, job: Job, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGINT to the job's process group now; SIGTERM if it is still running after `grace` seconds."""
        if job.pid is None or not job.running:
            return
        _signal_group(job.pid, signal.SIGINT)

        def escalate() -> None:
            deadline = time.time() + grace
            while time.time() < deadline:
                if not self._alive(job):
                    return
                time.sleep(0.5)
            if job.pid is not None and self._alive(job):
                _signal_group(job.pid, signal.SIGTERM)

        threading.Thread(target=escalate, name=f"stop-{job.id}", daemon=True).start()

    def _alive(self, job: Job) -> bool:
        child = self._children.get(job.id)
        if child is not None:
            return child.poll() is None
        return self.get(job.id).running

    def get(self, job_id: str) -> Job:
        path = self.root / job_id / JOB_FILE
        if not re.fullmatch(r"[0-9A-Za-z-]+", job_id) or not path.is_file():
            raise GymError(f"No web UI job {job_id!r} in {self.root}.")
        data = json.loads(path.read_text(encoding="utf-8"))
        job = Job(**{**data, "folder": Path(data["folder"])})
        child = self._children.get(job_id)
        if child is not None and child.pid == job.pid:
            job.child_running = child.poll() is None
        return job

    def list(self, kind: str | None = None) -> list[Job]:
        jobs = []
        for folder in sorted(self.root.iterdir(), reverse=True):
            if (folder / JOB_FILE).is_file():
                job = self.get(folder.name)
                if kind is None or job.kind == kind:
                    jobs.append(job)
        return jobs

    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        """Block until the job ends (or `timeout` passes); its exit code, or None while it still runs."""
        deadline = None if timeout is None else time.time() + timeout
        while self.get(job.id).running and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        return job.exit_code

    def _save(self, job: Job) -> None:
        data = {**asdict(job), "folder": str(job.folder)}
        data.pop("child_running")
        path = job.folder / JOB_FILE
        tmp = temp_path(path)
        tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
        os.replace(tmp, path)


def split_secrets(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the config without its credentials, {variable: value} that carries them to the job's process)."""
    rest = {k: v for k, v in config.items() if k not in SECRET_KEYS}
    env: dict[str, str] = {}
    given = {k: str(config[k]) for k in SECRET_KEYS if config.get(k)}
    for key, value in given.items():
        name = SECRET_KEYS[key]
        if env.setdefault(name, value) != value:
            others = ", ".join(k for k in given if SECRET_KEYS[k] == name)
            raise ConfigError(f"{others} differ: the web UI passes a job one Hugging Face token (as {name}, never "
                              "in a file). Give one of them, or run the two steps as two jobs.")
    return rest, env


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
        os.killpg(pid, sig)  # the supervisor leads its own session, so its pid is the group id
