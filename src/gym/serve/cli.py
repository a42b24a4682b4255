"""`gym api [CONFIG] [--host H] [--port P] ...`: the OpenAI-compatible server.

Images (vision-language models): data: URLs always; `--media-dir DIR` lets clients name files inside DIR as
file:// URLs, `--allow-remote-media` lets them name http(s) URLs, fetched at most `--max_media_bytes` each
(gym.serve.media).

The config's `serving:` block (gym.config.aliases) sets the batch size and how many requests are admitted
at once (the queue is what the batch leaves of it); a flag given on the command line wins over it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym.config.aliases import server_options
from gym.config.files import parse_cli_args, take_flag, take_option
from gym.config.parser import check_keys
from gym.core.errors import ConfigError
from gym.core.network import check_port_number
from gym.serve.limits import DEFAULT_GUARD_WINDOW
from gym.serve.media import DEFAULT_MAX_MEDIA_BYTES, MediaPolicy
from gym.service.limits import FileLimits, JobLimits

OPTIONS: dict[str, str | None] = {
    "--host": "127.0.0.1", "--port": "8000", "--api-key": None, "--max_batch_size": "16", "--max_waiting": "256",
    "--served_model_name": None, "--max_body_bytes": str(4 << 20), "--variants": None, "--experiences": None,
    "--media-dir": None, "--max_media_bytes": str(DEFAULT_MAX_MEDIA_BYTES), "--db": None,
    "--max_file_bytes": str(FileLimits.max_bytes), "--file_quota_bytes": str(FileLimits.quota_bytes),
    "--train-workers": "1", "--max_queued_jobs": "8", "--max_running_jobs": "1", "--job_options": None,
    "--guard": None, "--guard-window": str(DEFAULT_GUARD_WINDOW), "--guard-threshold": "0.5",
    "--safety-gate": None, "--safety-judge": None, "--safety-max-rise": None,
}
FLAGS = ("--allow-remote-media",)


USAGE = """usage: gym api [CONFIG | FOLDER] [key=value ...] [--host 127.0.0.1] [--port 8000] [--api-key KEY]
               [--max_batch_size 16] [--max_waiting 256] [--served_model_name NAME] [--max_body_bytes N]
               [--variants STORE] [--experiences FILE] [--media-dir DIR] [--allow-remote-media]
               [--max_media_bytes N] [--db URL] [--max_file_bytes N] [--file_quota_bytes N]
               [--train-workers 1] [--max_queued_jobs 8] [--max_running_jobs 1] [--job_options JSON]
               [--guard SPEC] [--guard-window 16] [--guard-threshold 0.5]
               [--safety-gate SET [--safety-judge refusal|GUARD_SPEC] [--safety-max-rise 0.05]]

An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /tokenize) for the model CONFIG
(or FOLDER: a finished run or a model folder) names, as `gym chat` loads it. --variants STORE serves each user's
variant as BASE:USER in the same batches.
A vision-language model takes image_url parts: data: URLs; file:// URLs only inside --media-dir DIR; http(s)
URLs only with --allow-remote-media (at most --max_media_bytes each, 10 s). See docs/serving.md.

With --variants STORE the store's API keys (`gym keys create STORE --user U`) make the server multi-tenant, and
/v1/files takes fine-tuning files (at most --max_file_bytes each, --file_quota_bytes per user). The keys and files
are recorded in STORE/service.db, or in the database --db URL names (postgresql://...). /v1/fine_tuning/jobs
queues fine-tuning jobs (at most --max_queued_jobs waiting and --max_running_jobs running per user), run by
--train-workers processes beside the server (niced, one thread each); --job_options '{"training": {...},
"delta_method": "bitdelta", "delta_options": {...}}' sets the operator's keys for every job. See docs/service.md.
--safety-gate SET gates every job's model: the base and the new variant answer the safety set (safety_demo,
advbench, a file), and a variant whose harmful compliance rose more than --safety-max-rise (or significantly) is not
published; the job fails with code safety_gate_refused and the numbers (docs/safety.md). In --job_options it is
"safety_gate": {"dataset": SET, "judge": ..., "max_rise": ...}; give it one way, not both.

--guard SPEC checks every request before it decodes (a flagged one is a 400, code content_filter) and every answer
as it streams, --guard-window tokens at a time (a flagged answer ends with finish_reason "content_filter"), and
answers POST /v1/moderations. SPEC: keywords:FILE (one regular expression per line), a guard model folder or hub
id (a sequence classifier, Llama Guard 3, ShieldGemma, Qwen3Guard, Granite Guardian), or FAMILY:PATH. Model
guards flag at --guard-threshold. See docs/safety.md."""

MAX_BATCH_SIZE = 1024  # vLLM's max_num_seqs defaults to 256; more than this is a typo, not a server


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(USAGE)
        return 0
    given: dict[str, str | None] = {}
    for name in OPTIONS:
        given[name], argv = take_option(argv, name)
    flags: dict[str, bool] = {}
    for flag in FLAGS:
        flags[flag], argv = take_flag(argv, flag)
    config = parse_cli_args(argv, model_folders=True)
    check_keys(config, [*OPTIONS, *FLAGS])
    block = server_options(config)
    if given["--max_batch_size"] is None and "batch_size" in block:
        given["--max_batch_size"] = str(block["batch_size"])
    values = {name: given[name] or default for name, default in OPTIONS.items()}
    if given["--max_waiting"] is None and "max_concurrent" in block:
        # the block counts every admitted request; the server's queue is what the running batch leaves
        batch = int(values["--max_batch_size"] or "16")
        if block["max_concurrent"] < batch:
            raise ConfigError(f"serving.max_concurrent ({block['max_concurrent']}) is below the batch size ({batch}): "
                              "it counts every request admitted at once, decoding or queued.")
        values["--max_waiting"] = str(block["max_concurrent"] - batch)
    try:
        port, batch, waiting, body, media_bytes, file_bytes, quota = (int(values[k] or "") for k in (
            "--port", "--max_batch_size", "--max_waiting", "--max_body_bytes", "--max_media_bytes",
            "--max_file_bytes", "--file_quota_bytes"))
    except ValueError:
        raise ConfigError("--port, --max_batch_size, --max_waiting, --max_body_bytes, --max_media_bytes, "
                          "--max_file_bytes and --file_quota_bytes take whole numbers.") from None
    try:
        workers, queued, running = (int(values[k] or "") for k in ("--train-workers", "--max_queued_jobs",
                                                                      "--max_running_jobs"))
    except ValueError:
        raise ConfigError("--train-workers, --max_queued_jobs and --max_running_jobs take whole numbers.") from None
    if workers < 0 or queued < 1 or running < 1:
        raise ConfigError("--train-workers must be 0 or more; --max_queued_jobs and --max_running_jobs at least 1.")
    job_options = _job_options(values["--job_options"])
    gate = safety_gate_option(values["--safety-gate"], values["--safety-judge"], values["--safety-max-rise"])
    if gate is not None:
        if not values["--variants"]:
            raise ConfigError("--safety-gate gates the fine-tuning jobs of a variant store: give --variants STORE too.")
        if job_options.get("safety_gate") is not None:  # one would silently replace the other
            raise ConfigError("The jobs' safety gate is given twice, by --safety-gate and by --job_options' "
                              "safety_gate; keep one.")
        job_options["safety_gate"] = gate
    if given["--db"] and not values["--variants"]:
        raise ConfigError("--db names the database of a variant store's keys and files: give --variants STORE too.")
    if file_bytes < 1 or quota < 1:
        raise ConfigError("--max_file_bytes and --file_quota_bytes must be at least 1.")
    if not 1 <= batch <= MAX_BATCH_SIZE:  # the engine holds a cache slot per row: 10**11 rows asked petabytes of it
        raise ConfigError(f"--max_batch_size must be from 1 to {MAX_BATCH_SIZE} (the rows decoded together), got "
                          f"{batch}.")
    media = media_policy(values["--media-dir"], flags["--allow-remote-media"], media_bytes)
    guard_window, guard_threshold = guard_options(values["--guard-window"], values["--guard-threshold"])
    if not values["--guard"] and (given["--guard-window"] or given["--guard-threshold"]):
        # without a guard they filter nothing: a server started so would serve unfiltered, believed filtered
        raise ConfigError("--guard-window and --guard-threshold set the guard: give --guard SPEC too.")
    check_port_number(port)  # at once; whether the port is free is known when serve() binds it, before loading
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("gym api needs FastAPI, uvicorn, SQLAlchemy and python-multipart: pip install "
                          "'zoo-gym[serve]'.") from None
    from gym.serve.server import serve

    serve(config, host=values["--host"] or "127.0.0.1", port=port, api_key=values["--api-key"],
          max_batch_size=batch, max_waiting=waiting, model_name=values["--served_model_name"], max_body_bytes=body,
          variants=values["--variants"], experiences=values["--experiences"], media=media, db=values["--db"],
          file_limits=FileLimits(max_bytes=file_bytes, quota_bytes=quota), train_workers=workers,
          job_limits=JobLimits(max_queued=queued, max_running=running), job_options=job_options,
          guard=values["--guard"], guard_window=guard_window, guard_threshold=guard_threshold)
    return 0


def guard_options(window: str | None, threshold: str | None) -> tuple[int, float]:
    try:
        size = int(window or "")
    except ValueError:
        raise ConfigError(f"--guard-window takes a whole number of tokens, got {window!r}.") from None
    try:
        level = float(threshold or "")
    except ValueError:
        raise ConfigError(f"--guard-threshold takes a probability, got {threshold!r}.") from None
    if size < 1:
        raise ConfigError(f"--guard-window must be at least 1 token, got {size}.")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"--guard-threshold is a probability strictly between 0 and 1, got {level}.")
    return size, level


def safety_gate_option(dataset: str | None, judge: str | None, max_rise: str | None) -> dict[str, Any] | None:
    """--safety-gate SET [--safety-judge J] [--safety-max-rise R] as the jobs' safety_gate (checked now)."""
    if dataset is None:
        if judge is not None or max_rise is not None:
            raise ConfigError("--safety-judge and --safety-max-rise set the jobs' safety gate: give --safety-gate SET.")
        return None
    gate: dict[str, Any] = {"dataset": dataset}
    if judge is not None:
        gate["judge"] = judge
    if max_rise is not None:
        try:
            gate["max_rise"] = float(max_rise)
        except ValueError:
            raise ConfigError(f"--safety-max-rise takes a share such as 0.05, got {max_rise!r}.") from None
    from gym.safety.gate import SafetyGate

    SafetyGate.from_dict(gate).check()  # the set reads and the judge loads, before the server starts
    return gate


def _job_options(text: str | None) -> dict[str, Any]:
    """--job_options: a JSON object of training (Gym training keys), delta_method, delta_options and safety_gate."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--job_options: not JSON ({exc.msg}).") from None
    known = {"training", "delta_method", "delta_options", "safety_gate"}
    if not isinstance(options, dict) or set(options) - known:
        raise ConfigError(f"--job_options: a JSON object with {', '.join(sorted(known))} only.")
    from gym.service.jobs import check_job_options

    try:
        check_job_options(options)
    except ConfigError as exc:
        raise ConfigError(f"--job_options: {exc}") from None
    return options


def media_policy(media_dir: str | None, allow_remote: bool, max_bytes: int) -> MediaPolicy:
    """The image URL rules from the flags; a --media-dir that is not a folder fails now, not at the first image."""
    if media_dir is not None and not Path(media_dir).expanduser().is_dir():
        raise ConfigError(f"--media-dir {media_dir}: no such folder.")
    if max_bytes < 1:
        raise ConfigError("--max_media_bytes must be at least 1.")
    return MediaPolicy(Path(media_dir) if media_dir else None, allow_remote=allow_remote, max_bytes=max_bytes)
